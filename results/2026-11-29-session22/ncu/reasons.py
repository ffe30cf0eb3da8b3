"""The consumers' stall reasons in a Gluon backward's SASS table (ncu --page source --csv
--print-source sass), the producer's warps left out (its code lies between its setmaxnreg dealloc
and the consumers' alloc). usage: python3 reasons.py TABLE.csv.gz [...]"""
import collections, csv, gzip, sys

for f in sys.argv[1:]:
    rows = list(csv.reader(gzip.open(f, "rt")))
    hdr = rows[1]
    data = [r for r in rows[2:] if len(r) >= len(hdr)]
    ix = {h: i for i, h in enumerate(hdr)}
    src = [r[ix["Source"]].strip() for r in data]
    addr = [int(r[ix["Address"]], 16) & 0xfffff for r in data]
    samples = [int(r[ix["Warp Stall Sampling (All Samples)"]] or 0) for r in data]
    lo = [addr[i] for i, s in enumerate(src) if "USETMAXREG.DEALLOC.CTAPOOL 0x18" in s][0]
    hi = [addr[i] for i, s in enumerate(src) if "USETMAXREG.TRY_ALLOC" in s][-1]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    cons, prod = collections.Counter(), 0
    for i in range(len(data)):
        if lo <= addr[i] < hi:
            prod += samples[i]
            continue
        for h in reasons:
            cons[h] += int(data[i][ix[h]] or 0)
    total = sum(cons.values())
    print(f"{f}: producer {100 * prod / sum(samples):.1f}% of samples; the consumers' by reason:")
    print("   " + ", ".join(f"{k[6:]} {100 * v / total:.1f}%" for k, v in cons.most_common(8)))
