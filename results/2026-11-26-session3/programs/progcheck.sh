# a save run of the 1k speed cases, then which saved runs have a program
bash tools/install_offline.sh || exit 1
nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u
mkdir -p /tmp/bs && timeout 200 python3 -m pytest --attnkit --attnkit-suite=speed --attnkit-impl=torch_sdpa,triton_flash,cupy_naive \
  --attnkit-save-baseline --attnkit-baseline-dir=/tmp/bs -p no:cacheprovider -q -k "q1024 or q4096" 2>&1 | tail -12
python3 - <<'PY'
import json, glob
for f in glob.glob('/tmp/bs/*.json'):
    e = json.load(open(f))['entries']
    print(f, len(e), 'entries')
    for k, v in sorted(e.items()):
        h = v.get('history', [])
        print(f"  {k}: runs {len(h)}, with a program {sum(1 for r in h if r.get('program'))}: {(h[-1].get('program') or '-')[:70]}")
PY
cp -r /tmp/bs $OUT/
