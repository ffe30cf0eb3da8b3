import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ta = {t["test"]: t for t in a["tests"]}; tb = {t["test"]: t for t in b["tests"]}
keys = ("outcome", "reason", "message")
differ = [k for k in ta if k in tb and any(ta[k][f] != tb[k][f] for f in keys)]
print(f"outcome, reason and message compared exactly: {len(set(ta) & set(tb))} tests in both "
      f"({len(ta)} / {len(tb)}), {len(differ)} differ; only in one: {len(set(ta) ^ set(tb))}; "
      f"same order: {list(ta) == list(tb)}; top-level report keys the same: {sorted(a) == sorted(b)}")
for k in differ[:10]:
    print(k, {f: (ta[k][f], tb[k][f]) for f in keys if ta[k][f] != tb[k][f]})
