"""Adapt the shipped corrector to one recogniser and its transcribers: `python -m model.adapt --data FILE --out DIR`.

Reads the competition's labelled file(s) (a JSON list or JSONL of `id`, `ground_truth_sentence`, `sentence_list`,
`phoneme_sequence_list`; 1 to 10 hypotheses, with or without phones; a malformed row is named and counted), splits
the rows by a seeded hash of their ids into train / dev / test, and then:

1. builds a **domain language model** of the train truths (IRSTLM, a character 4-gram; `model.adaptation`);
2. learns **the recogniser's confusions** (TOP1 → truth rewrite rules with counts and rates) and, among them,
   **the transcribers' conventions** (variant forms and fillers written otherwise, seen clearly);
3. **fine-tunes the network** from the shipped weights on the train lists (checkpoints in `--ckpt-dir`, resumed
   when rerun) and keeps it only if, alone, it does better than the shipped network on the dev lists;
4. **refits the second stage** (its weights, the domain LM's and the confusions' among them, drawn towards the
   shipped stage's, and its margin) on the dev lists and the train lists cross-fitted (each of `--folds` folds
   described by the domain LM and confusions the other folds taught), under the precision bound: at most
   `--max-worse` of those lists made worse and `--max-right-changed` of their right TOP1s changed;
5. writes one complete weights folder (network, vocabulary, domain LM, confusions, fitted stage, provenance)
   that `WEIGHTS_DIR=DIR make run` serves, and prints the held-out test split's table: TOP1, the shipped model,
   the adapted one. The dev figures are the ones the stage was fitted on, and are labelled so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from model.adaptation import (
    CONFUSIONS_FILE,
    DOMAIN_LM_FILE,
    Adaptation,
    AdaptationError,
    Conventions,
    DomainLM,
    build_domain_lm,
    save_confusions,
    sha256,
)
from model.corrector import WEIGHTS_DIR, Corrector
from model.evaluate import ROWS, cer_score, table
from model.features import Featurizer
from model.network import CorrectorNet
from model.rerank import RerankWeights
from model.train import dev_probs, fit, pick_threshold, save, shipped_start
from model.train import parse_args as train_args
from model.train_data import labelled_examples
from model.tune import DevList, dev_lists, fit_lists
from model.tune import fit as fit_stage
from preprocess.labelled import Labelled, LabelledFormatError, read_labelled_lenient, split_three
from preprocess.rules import Confusions
from preprocess.text import NBest, han_only

MAX_HYPOTHESES = 10
SHOWN_MALFORMED = 20


def read_files(paths: list[Path]) -> tuple[list[Labelled], list[dict[str, Any]]]:
    """Read every file leniently: print its rows and each malformed row; return the rows and a record per file."""
    items: list[Labelled] = []
    record = []
    seen: set[str] = set()
    for path in paths:
        read = read_labelled_lenient(path)
        dup = [it for it in read.items if it.id in seen]
        malformed = read.malformed + [f"{path}: id {it.id!r} already read from an earlier file" for it in dup]
        kept = [it for it in read.items if it.id not in seen]
        seen.update(it.id for it in kept)
        print(f"{path}: {len(kept)} rows read, {len(malformed)} malformed")
        for line in malformed[:SHOWN_MALFORMED]:
            print(f"  malformed: {line}")
        if len(malformed) > SHOWN_MALFORMED:
            print(f"  ... and {len(malformed) - SHOWN_MALFORMED} more malformed rows")
        items += kept
        record.append({"file": path.name, "sha256": sha256(path), "rows": len(kept), "malformed": len(malformed)})
    return items, record


def nbests(items: list[Labelled]) -> list[NBest]:
    return [NBest(it.nbest.sentences[:MAX_HYPOTHESES], it.nbest.phonemes[:MAX_HYPOTHESES]) for it in items]


def answers(corrector: Corrector, lists: list[NBest], desc: str) -> list[str]:
    """Answer lists in batches of 64, with a progress bar."""
    out: list[str] = []
    for start in tqdm(range(0, len(lists), 64), desc=desc, mininterval=5, leave=False):
        out += corrector.predict_batch(lists[start : start + 64])
    return out


def fine_tune(args: argparse.Namespace, train: list[Labelled], dev: list[Labelled], device: torch.device,
              out: Path) -> dict[str, Any]:
    """Fine-tune the shipped network on the train lists; save it to `out` if it beats the shipped one on dev."""
    start = shipped_start(args.init_from)
    feat = Featurizer(start.vocab)
    train_ex, _, left_train = labelled_examples(feat, train)
    dev_ex, dev_truth, _ = labelled_examples(feat, dev)
    steps = max(1, round(args.epochs * len(train_ex) / args.batch_size))
    targs = train_args(["--init", "shipped", "--init-from", str(args.init_from), "--sim-ratio", "0",
                        "--steps", str(steps), "--warmup", str(max(1, steps // 10)), "--lr", str(args.lr),
                        "--batch-size", str(args.batch_size), "--ckpt-dir", str(args.ckpt_dir),
                        "--seed", str(args.seed), "--max-minutes", str(args.max_train_minutes),
                        *[a for p in args.data for a in ("--data", str(p))]])
    shipped_net = CorrectorNet(start.net_cfg)
    shipped_net.load_state_dict(start.state)
    net = CorrectorNet(start.net_cfg)
    net.load_state_dict(start.state)
    net = net.to(device)
    done = fit(net, train_ex, targs, device) if train_ex else 0
    # the network alone on dev, each at its best threshold within the precision bound: keep the better one
    tuned = pick_threshold(dev_ex, dev_probs(net, dev_ex, device), dev_truth) if dev_ex else (start.threshold, {})
    base = pick_threshold(dev_ex, dev_probs(shipped_net.to(device), dev_ex, device), dev_truth) if dev_ex else tuned
    keep_tuned = bool(dev_ex) and tuned[1]["cer"] < base[1]["cer"]
    chosen_net, (threshold, dev_figures) = (net, tuned) if keep_tuned else (shipped_net, base)
    record = {"network": "fine-tuned" if keep_tuned else "shipped (fine-tuning did not help on dev)",
              "steps": done, "train_lists": len(train_ex), "left_out": left_train,
              "dev_network_alone_fine_tuned": tuned[1], "dev_network_alone_shipped": base[1]}
    save(out, chosen_net, start, threshold, {"adapt": record | {"note": "dev figures were used to choose"}})
    return record


def learn(items: list[Labelled], out: Path, min_count: int) -> tuple[dict[str, int], Confusions]:
    """Build the domain LM and learn the confusions of `items` into `out`."""
    truths = [han_only(it.truth) for it in items]
    lm_counts = build_domain_lm(truths, out / DOMAIN_LM_FILE)
    pairs = [(han_only(it.nbest.top1), truth) for it, truth in zip(items, truths, strict=True)]
    confusions = Confusions.learn([p for p in pairs if p[0] and p[1]], min_count=min_count)
    save_confusions(confusions, out / CONFUSIONS_FILE)
    return lm_counts, confusions


def fold_of(item_id: str, seed: int, folds: int) -> int:
    return int.from_bytes(hashlib.sha256(f"fold:{seed}:{item_id}".encode()).digest()[:8], "big") % folds


def cross_fitted_lists(args: argparse.Namespace, train: list[Labelled], corrector: Corrector) -> list[DevList]:
    """Describe the train lists for fitting the stage, each fold with the domain LM and confusions learned from the
    other folds (never from itself), and with `corrector`'s network."""
    if args.folds < 2 or len(train) < args.folds:
        return []
    out: list[DevList] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in tqdm(range(args.folds), desc="cross-fitting", leave=False):
            held = [it for it in train if fold_of(it.id, args.seed, args.folds) == k]
            rest = [it for it in train if fold_of(it.id, args.seed, args.folds) != k]
            part = Path(tmp) / f"fold{k}"
            part.mkdir()
            _, confusions = learn(rest, part, args.min_count)
            assert corrector.lm is not None
            adaptation = Adaptation(DomainLM(part / DOMAIN_LM_FILE), confusions,
                                    Conventions.from_confusions(confusions, corrector.lm.to_simplified))
            out += dev_lists(corrector, nbests(held), [han_only(it.truth) for it in held], use_net=True,
                             adaptation=adaptation)
    return out


def write_meta(out: Path, update: dict[str, Any]) -> None:
    path = out / "config.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta.update(update)
    path.write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Adapt the corrector to a recogniser's labelled lists.")
    ap.add_argument("--data", type=Path, action="append", required=True,
                    help="labelled file (the competition's JSON list, or JSONL); repeatable")
    ap.add_argument("--out", type=Path, required=True, help="the weights folder to write (WEIGHTS_DIR to serve it)")
    ap.add_argument("--init-from", type=Path, default=WEIGHTS_DIR, help="the shipped weights to start from")
    ap.add_argument("--dev-share", type=float, default=0.15, help="share of the ids the stage is fitted on")
    ap.add_argument("--test-share", type=float, default=0.15, help="share of the ids held out for the report")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--folds", type=int, default=2,
                    help="the train lists join the stage's fitting, each fold described by what the others taught "
                         "(0: the dev lists alone)")
    ap.add_argument("--min-count", type=int, default=2, help="a confusion seen fewer times is not learned")
    ap.add_argument("--epochs", type=float, default=3.0, help="fine-tuning epochs over the train lists (0: none)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-train-minutes", type=float, default=30.0)
    ap.add_argument("--prior-lists", type=float, default=50.0,
                    help="how many dev lists the shipped stage's weights count for when refitting them")
    # the precision bound, on the dev lists and the cross-fitted train lists together (thousands of lists: the share
    # is estimated well enough to use the whole bound)
    ap.add_argument("--max-worse", type=float, default=0.005)
    ap.add_argument("--max-right-changed", type=float, default=0.005)
    ap.add_argument("--ckpt-dir", type=Path, default=None, help="default: checkpoints/adapt-<out folder's name>")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    args = ap.parse_args(argv)
    if not (0 < args.dev_share < 1 and 0 <= args.test_share < 1 and args.dev_share + args.test_share < 1):
        ap.error(f"--dev-share and --test-share must leave a train share, got {args.dev_share} and {args.test_share}")
    args.ckpt_dir = args.ckpt_dir or Path("checkpoints") / f"adapt-{args.out.resolve().name}"
    return args


def main(argv: list[str] | None = None) -> int:
    """Adapt as the command line says; exit 2 with one line when the input cannot be used."""
    args = parse_args(argv)
    wall0, cpu0 = time.monotonic(), time.process_time()
    try:
        return run(args, wall0, cpu0)
    except (LabelledFormatError, AdaptationError, OSError) as e:
        print(f"adapt: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, wall0: float, cpu0: float) -> int:
    items, files = read_files(args.data)
    split = split_three(items, args.dev_share, args.test_share, args.seed)
    print(f"split by id (seed {args.seed}): {split.sizes()}")
    if not split.train or not split.dev:
        raise AdaptationError(f"too few rows to adapt: {split.sizes()} (train and dev need at least one each)")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")

    print("1/5 domain language model (IRSTLM) from the train truths; 2/5 the recogniser's confusions")
    lm_counts, confusions = learn(split.train, out, args.min_count)
    print(f"    {lm_counts}; {len(confusions)} confusion rules")

    print(f"3/5 fine-tuning the network on {len(split.train)} lists ({device})")
    network = fine_tune(args, split.train, split.dev, device, out) if args.epochs > 0 else _copy_network(args, out)
    print(f"    kept: {network['network']}; {network.get('left_out', 0)} train lists left out of fine-tuning (TOP1 or "
          f"truth without Han characters: the service answers such a TOP1 as it is)")
    write_meta(out, {"adaptation": {"files": Adaptation.files_record(out)}})

    adapted = Corrector(out, device=args.device, stage="net")  # the stage is what is being fitted
    adapted.setup()
    assert adapted.adaptation is not None  # the folder names its parts: setup loaded them
    conventions: Conventions = adapted.adaptation.conventions
    print(f"    conventions: {conventions.describe() or 'none clear'}")
    print(f"4/5 refitting the second stage on {len(split.dev)} dev lists and, cross-fitted in {args.folds} folds, "
          f"the {len(split.train)} train lists")
    dev_nb, dev_truths = nbests(split.dev), [han_only(it.truth) for it in split.dev]
    lists = dev_lists(adapted, dev_nb, dev_truths, use_net=True, adaptation=adapted.adaptation)
    lists += cross_fitted_lists(args, split.train, adapted)
    shipped_stages = json.loads((args.init_from / "config.json").read_text(encoding="utf-8")).get("rerank", {})
    priors = {v: RerankWeights.from_dict(shipped_stages[v]["weights"]) if v in shipped_stages else None
              for v in ("full", "lm")}
    full, full_figures = fit_lists(lists, "full", args.max_worse, args.max_right_changed, priors["full"],
                                   args.prior_lists)
    lm_only, lm_figures = fit_stage(adapted, dev_nb, dev_truths, "lm", args.max_worse, args.max_right_changed,
                                    prior=priors["lm"], prior_lists=args.prior_lists)
    fitted_on = "fitted on these lists (dev, and the train lists cross-fitted), not held out"
    stages = {"full": {"weights": full.to_dict(), "dev": full_figures | {"note": fitted_on}},
              "lm": {"weights": lm_only.to_dict(), "dev": lm_figures | {"note": "fitted on the dev lists"}}}
    print(f"    the lists fitted on (not held out): CER {full_figures['top1_cer']:.2%} (TOP1) -> "
          f"{full_figures['cer']:.2%}; weights {json.dumps(stages['full']['weights'])}")
    write_meta(out, {"rerank": stages})

    print(f"5/5 the held-out test split ({len(split.test)} lists)")
    figures: dict[str, Any] = {}
    if split.test:
        adapted = Corrector(out, device=args.device)
        adapted.setup()
        shipped = Corrector(args.init_from, device=args.device)
        shipped.setup()
        lists, truths = nbests(split.test), [han_only(it.truth) for it in split.test]
        for name, corrector in (("shipped", shipped), ("adapted", adapted)):
            figures[name] = asdict(cer_score(lists, truths, answers(corrector, lists, name)))
        print(f"\n## held-out test split ({len(split.test)} lists; TOP1 in the top1_cer row)\n")
        print(table(figures, ROWS))
        rel = 1 - figures["adapted"]["answer_cer"] / max(figures["shipped"]["answer_cer"], 1e-9)
        print(f"\nadapted vs shipped: {rel:.1%} relative CER")
    cpu_s = time.process_time() - cpu0 + _children_cpu_s()
    provenance = {
        "data": files, "split": split.sizes() | {"seed": args.seed, "dev_share": args.dev_share,
                                                  "test_share": args.test_share, "by": "sha256 of seed:id"},
        "domain_lm": lm_counts | {"order": 4, "toolkit": "IRSTLM tlm -lm=msb"},
        "confusions": len(confusions), "conventions": conventions.describe(), "network": network,
        "test": figures, "dev_note": "rerank.*.dev are the dev lists the stage was fitted on",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": round(time.monotonic() - wall0, 1),
        "cpu_s": round(cpu_s, 1), "device": str(device), "args": {k: str(v) for k, v in vars(args).items()},
    }
    meta_path = out / "config.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta["adaptation"]["provenance"] = provenance
    meta.pop("evaluation", None)  # the shipped model's figures are not this folder's
    meta_path.write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"\nwrote {out} in {provenance['wall_s']:.0f} s ({cpu_s:.0f} s of CPU); serve it with WEIGHTS_DIR={out} "
          f"make run")
    return 0


def _copy_network(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """--epochs 0: the shipped network, vocabulary and config, as they are."""
    for name in ("model.safetensors", "vocab.json", "config.json"):
        shutil.copyfile(args.init_from / name, out / name)
    write_meta(out, {"rerank": {}})
    return {"network": "shipped (--epochs 0)"}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())
