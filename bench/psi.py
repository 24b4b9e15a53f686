"""What the entity-id exchange costs (linkage/psi.py, app/entity_aug/id_exchange.py): seconds and
bytes of one label holder meeting one guest, at growing id counts, half of the guest's ids shared.

    python -m bench.psi [--sizes 1000 10000 100000]

Per size: the label holder's blinding of its ids, the guest's answer (its own ids blinded and the
label holder's reblinded), the label holder's reblinding and matching; bytes each way (32 per id);
whether the matches equal a plain join of the ids (they must).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from app.run_record import machine
from linkage.psi import POINT, Blinder, matches


def one(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    label_ids = [f"id{v}" for v in rng.permutation(2 * n)[:n]]
    guest_ids = [f"id{v}" for v in rng.permutation(2 * n)[:n]]
    label, guest = Blinder(), Blinder()
    t0 = time.perf_counter()
    sent = label.blind(label_ids)
    t1 = time.perf_counter()
    own, theirs = guest.blind(guest_ids), guest.reblind(sent, "the label holder")
    t2 = time.perf_counter()
    got = matches(theirs, label.reblind(own, "guest"))
    t3 = time.perf_counter()
    where = {v: i for i, v in enumerate(guest_ids)}
    want = np.array([where.get(v, -1) for v in label_ids])
    return {
        "ids_each": n,
        "shared": int((want >= 0).sum()),
        "label_blind_s": round(t1 - t0, 3),
        "guest_answer_s": round(t2 - t1, 3),
        "label_match_s": round(t3 - t2, 3),
        "total_s": round(t3 - t0, 3),
        "bytes_to_guest": n * POINT,
        "bytes_to_label_holder": 2 * n * POINT,
        "equals_plain_join": bool(np.array_equal(got, want)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    args = ap.parse_args()
    print(json.dumps({"machine": machine(), "runs": [one(n) for n in args.sizes]}, indent=1))


if __name__ == "__main__":
    main()
