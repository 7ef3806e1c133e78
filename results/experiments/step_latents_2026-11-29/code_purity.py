"""H(result | code), best-map accuracy of step codes vs step results, result entropy."""
import json, sys, math, collections
sys.path.insert(0, '/work/main')
from dlr_jax.data.cot_view import step_results
wd = sys.argv[1]
for split in ("train", "test"):
    pairs = []
    for l in open(f"{wd}/latents/{split}.jsonl"):
        r = json.loads(l); res = step_results(r["cot"])
        if len(res) == len(r["latents"]):
            pairs += list(zip(r["latents"], res))
    by = collections.defaultdict(collections.Counter)
    for c, v in pairs: by[c][v] += 1
    n = len(pairs)
    acc = sum(max(cnt.values()) for cnt in by.values()) / n
    hcond = -sum(k / n * math.log2(k / sum(cnt.values())) for cnt in by.values() for k in cnt.values())
    vc = collections.Counter(v for _, v in pairs)
    hres = -sum(k / n * math.log2(k / n) for k in vc.values())
    # per result: does it map to a single code?
    byv = collections.defaultdict(collections.Counter)
    for c, v in pairs: byv[v][c] += 1
    inj = sum(max(cnt.values()) for cnt in byv.values()) / n
    print(f"{split}: steps {n}, codes {len(by)}, results {len(vc)}, H(result) {hres:.2f} bits, H(result|code) {hcond:.2f}, "
          f"code->result acc {acc:.3f}, result->code consistency {inj:.3f}")
