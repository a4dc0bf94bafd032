"""Fit the second stage's weights and margin on dev lists: `python -m learn.tune [--data FILE ...]`.

Dev lists are the news dev split (documents never trained on) simulated by the default recogniser and by
recognisers drawn around it, plus any labelled files given with `--data` (the competition's format). For each
list the candidates of `model.rerank` are described by their features and their edit distance to the truth;
the weights maximise the likelihood of the best candidates under a softmax over each list's candidates
(listwise, L2-regularised), and the margin is the one with the lowest CER that keeps precision: at most
`--max-worse` of the sentences made worse and at most `--max-right-changed` of right TOP1s changed.
`--variant` fits the ablations: `lm` (language model and rank prior over the n-best only) or `full`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from rapidfuzz.distance import Levenshtein

from config import DEFAULT_WEIGHTS_DIR
from learn.data.decode_sim import decoded_dev
from learn.data.simulate import load_simulator
from learn.dev_list import DevList, pick_cut, thin_bounds
from learn.gate_fit import fit_focus, fit_gate
from learn.written import wrote
from model.adaptation import Adaptation
from model.corrector import Corrector
from model.gate import Gate, context, scatter
from model.masked_lm import MaskedLM
from model.rerank import Features, Reranker, RerankWeights
from model.weights_meta import RerankStage, WeightsMeta
from preprocess.text import NBest

LM_ONLY = ("lm", "taiwan", "rank", "outside_nbest", "changes", "oov", "domain", "confusion")
# Signs the weights must have, whatever the simulated dev lists say: a likelier sentence (by the trigram, by
# Taiwan usage, by the network) is better, a sentence nobody offered or with more changes is worse. Our dev
# text is mainland news, where Taiwan usage tells little; on Taiwan speech it is what keeps Taiwan words.
SIGNS = {"lm": 1.0, "taiwan": 1.0, "net": 1.0, "outside_nbest": -1.0, "changes": -1.0, "domain": 1.0,
         "confusion": 1.0, "mlm": 1.0}


def dev_lists(corrector: Corrector, nbests: list[NBest], truths: list[str], use_net: bool,
              adaptation: Adaptation | None = None, masked_lm: MaskedLM | None = None) -> list[DevList]:
    """Describe every candidate of every list, with its errors (candidates and features of `adaptation`, when
    given: an adapted stage is fitted on lists its adaptation was not learned from; the `mlm` feature scored by
    `masked_lm`, when given, else 0). A list the corrector answers without the second stage (TOP1 without a Han
    character) is left out."""
    return [d for d in described_lists(corrector, nbests, truths, use_net, adaptation, masked_lm) if d is not None]


def described_lists(corrector: Corrector, nbests: list[NBest], truths: list[str], use_net: bool,
                    adaptation: Adaptation | None = None, masked_lm: MaskedLM | None = None) -> list[DevList | None]:
    """`dev_lists`, one entry per list in order: None where the second stage does not see the list."""
    out: list[DevList | None] = []
    reranker = Reranker(corrector.lm, RerankWeights(), adaptation, masked_lm=masked_lm)
    for start in range(0, len(nbests), 64):
        chunk = nbests[start : start + 64]
        batch = corrector.batch(chunk)
        probs = corrector.predict(batch)
        seen = [k for k, example in enumerate(batch.examples) if example is not None]
        examples = [batch.examples[k] for k in seen]
        ps = [probs[k] if use_net else None for k in seen]
        cands = [reranker.candidates(example, p) for example, p in zip(examples, ps, strict=True)]
        described: dict[int, DevList] = {}
        for k, example, p, cs, gains in zip(seen, examples, ps, cands, reranker.mlm_gains(examples, cands),
                                            strict=True):
            truth = truths[start + k]
            rows = np.stack([f.vector() for f in reranker.features(example, p, cs, gains)])
            described[k] = DevList(rows, np.array([Levenshtein.distance(c.text, truth) for c in cs]), len(truth),
                                   context(example, rows, [c.choice for c in cs], Features.names()), scatter(example))
        out += [described.get(k) for k in range(len(chunk))]
    return out


def fit_weights(lists: list[DevList], mask: np.ndarray, l2: float = 1e-3, steps: int = 200,
                prior: np.ndarray | None = None, prior_lists: float = 0.0) -> np.ndarray:
    """Maximise the softmax likelihood of each list's least-error candidates (features outside `mask` are 0).

    With `prior` (another stage's weights), the weights are drawn towards it as strongly as `prior_lists` lists
    would: a few dev lists move the shipped weights a little, many move them far.
    """
    useful = [d for d in lists if len(d.errors) > 1 and d.errors.min() < d.errors.max()]
    k_max = max((len(d.errors) for d in useful), default=1)
    x = np.zeros((len(useful), k_max, len(mask)))
    valid = np.zeros((len(useful), k_max), dtype=bool)
    gold = np.zeros((len(useful), k_max), dtype=bool)
    for n, d in enumerate(useful):
        k = len(d.errors)
        x[n, :k], valid[n, :k], gold[n, :k] = d.feats, True, d.errors == d.errors.min()
    xt, vt, gt = torch.tensor(x), torch.tensor(valid), torch.tensor(gold)
    m = torch.tensor(mask, dtype=torch.float64)
    names = Features.names()
    sign = torch.tensor([SIGNS.get(n, 0.0) for n in names], dtype=torch.float64)
    v = torch.zeros(len(mask), dtype=torch.float64, requires_grad=True)
    p0 = torch.tensor(prior if prior is not None else np.zeros(len(mask)), dtype=torch.float64) * m
    # the masked LM's weight is not drawn: no stage before weighed one, so a prior's 0 there is no opinion
    drawn = torch.tensor([n != "mlm" for n in names], dtype=torch.float64)
    opt = torch.optim.LBFGS([v], max_iter=steps, line_search_fn="strong_wolfe")

    def weights() -> torch.Tensor:
        # a signed feature's weight is sign * softplus(v); a free one is v
        return torch.where(sign != 0, sign * torch.nn.functional.softplus(v), v) * m

    def closure() -> torch.Tensor:
        opt.zero_grad()
        w = weights()
        s = xt @ w
        all_ = torch.logsumexp(s.masked_fill(~vt, -1e9), 1)
        good = torch.logsumexp(s.masked_fill(~gt, -1e9), 1)
        loss = (all_ - good).mean() + l2 * (w * w).sum()
        if prior is not None:
            loss = loss + prior_lists / max(1, len(useful)) * (((w - p0) * drawn) ** 2).sum()
        loss.backward()
        return loss

    if len(useful):
        opt.step(closure)
    return weights().detach().numpy()


def pick_margin(lists: list[DevList], w: np.ndarray, max_worse: float, max_right_changed: float,
                groups: list[int] | None = None) -> tuple[float, dict]:
    """Choose the margin with the lowest CER within the precision bounds, on all lists and, with `groups` (one id
    per list: the profile or file it came from), on each group alone: a margin that keeps the bounds on easy lists
    on average may break them on a hard recogniser's, whose share is small."""
    leads, chosen = [], []  # score lead of the best candidate other than TOP1, and its errors
    for d in lists:
        s = d.feats @ w
        if len(s) < 2:
            leads.append(-math.inf)
            chosen.append(int(d.errors[0]))
            continue
        b = 1 + int(np.argmax(s[1:]))
        leads.append(float(s[b] - s[0]))
        chosen.append(int(d.errors[b]))
    return pick_cut(lists, np.array(leads), np.array(chosen), max_worse, max_right_changed, groups)


def stage_cer(lists: list[DevList], weights: RerankWeights, gate: Gate | None = None) -> float:
    """The CER a stage's weights, margin and gate give on described lists, counted as `pick_margin` counts."""
    w = weights.vector()
    errors = sum(_chosen_errors(d, w, weights.margin, weights, gate) for d in lists)
    return errors / max(1, sum(d.truth_len for d in lists))


def _chosen_errors(d: DevList, w: np.ndarray, margin: float, rules: RerankWeights | None = None,
                   gate: Gate | None = None) -> int:
    """The errors of what a stage answers for one list: its best other sentence past the margin (and its gate,
    when given), else the rule pass's choice (`rules`, when given), else TOP1."""
    s = d.feats @ w
    if len(s) > 1:
        b = 1 + int(np.argmax(s[1:]))
        lead = float(s[b] - s[0])
        if gate is not None and 0 < d.scatter < gate.focus_scatter:  # `Reranker._answers`
            if lead >= gate.focus_margin:
                return int(d.errors[b])
        elif lead >= margin and (gate is None or d.context is None or gate.admits(lead, d.context[b])):
            return int(d.errors[b])
    ruled = rules.rule_pass(d.feats) if rules is not None else None
    return int(d.errors[ruled if ruled is not None else 0])


# the rule pass's settings tried (learn.adapt): the least trust, the domain LM's weight beside the trigram's, the lead
RULE_TRUSTS = (0.3, 0.4, 0.5, 0.6, 0.7)
RULE_DOMAIN = (0.5, 1.0)
RULE_MARGINS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)


def pick_rule_pass(lists: list[DevList], weights: RerankWeights, max_worse: float,
                   max_right_changed: float) -> tuple[RerankWeights, dict]:
    """Fit the rule pass (`RerankWeights.rule_pass`) beside a fitted stage: of `RULE_TRUSTS` x `RULE_DOMAIN` x
    `RULE_MARGINS`, the setting with the lowest CER on `lists` that keeps at most `max_worse` of them made worse and
    `max_right_changed` of their right TOP1s changed (the stage's answers counted too; ties: the stricter setting);
    none, when no setting does better than the stage alone. Return the weights and their figures."""
    w = weights.vector()
    total = max(1, sum(d.truth_len for d in lists))
    n_right = max(1, sum(int(d.errors[0]) == 0 for d in lists))

    def figures(rules: RerankWeights) -> dict:
        chosen = [(_chosen_errors(d, w, weights.margin, rules), int(d.errors[0])) for d in lists]
        return {"cer": sum(a for a, _ in chosen) / total, "worse": sum(a > b for a, b in chosen) / max(1, len(lists)),
                "right_changed": sum(b == 0 and a != 0 for a, b in chosen) / n_right}

    best, best_figures = weights, figures(weights)
    for trust in sorted(RULE_TRUSTS, reverse=True):
        for dom in RULE_DOMAIN:
            for margin in sorted(RULE_MARGINS, reverse=True):
                rules = replace(weights, rule_trust=trust, rule_domain=dom, rule_margin=margin)
                f = figures(rules)
                if f["worse"] <= max_worse and f["right_changed"] <= max_right_changed and \
                        f["cer"] < best_figures["cer"] - 1e-12:
                    best, best_figures = rules, f
    return best, best_figures


def breaks_bounds(lists: list[DevList], weights: RerankWeights, max_worse: float, max_right_changed: float,
                  groups: list[int] | None = None, gate: Gate | None = None) -> bool:
    """Whether a stage's weights and margin make more than `max_worse` of the lists worse, or change more than
    `max_right_changed` of the right TOP1s, on all lists or (with `groups`) in any group alone."""
    w = weights.vector()
    ids = groups if groups is not None else [0] * len(lists)
    counts: dict[int, list[int]] = {}  # group: [lists, worse, right TOP1s, right TOP1s changed]
    for d, g in zip(lists, ids, strict=True):
        chosen = _chosen_errors(d, w, weights.margin, weights, gate)
        c = counts.setdefault(g, [0, 0, 0, 0])
        c[0] += 1
        c[1] += chosen > d.errors[0]
        c[2] += d.errors[0] == 0
        c[3] += d.errors[0] == 0 and chosen != 0
    total = [sum(c[k] for c in counts.values()) for k in range(4)]
    return any(c[1] > max_worse * c[0] or c[3] > max_right_changed * max(1, c[2]) for c in [total, *counts.values()])


def simulated_dev(corpus: Path, n: int, seed: int) -> tuple[list[NBest], list[str]]:
    """Simulate dev lists: half by the default recogniser, half by recognisers drawn around it."""
    from learn.train_data import jittered

    sim = load_simulator(corpus)
    base = sim.config
    rng = random.Random(seed)
    sents = [s for s in (corpus / "dev.txt").read_text(encoding="utf-8").split("\n") if s][:n]
    nbests = []
    truths = []
    for k, s in enumerate(sents):
        sim.config = base if k % 2 == 0 else jittered(rng)
        nbest, truth = sim.sample(s, rng)
        nbests.append(nbest)
        truths.append(truth)
    sim.config = base
    return nbests, truths


def fit(corrector: Corrector, nbests: list[NBest], truths: list[str], variant: str, max_worse: float,
        max_right_changed: float, prior: RerankWeights | None = None,
        prior_lists: float = 0.0) -> tuple[RerankWeights, dict]:
    """Fit one variant's weights and margin on dev lists (drawn towards `prior`'s weights, when given)."""
    lists = dev_lists(corrector, nbests, truths, use_net=variant == "full", adaptation=corrector.adaptation)
    return fit_lists(lists, variant, max_worse, max_right_changed, prior, prior_lists)


def fit_lists(lists: list[DevList], variant: str, max_worse: float, max_right_changed: float,
              prior: RerankWeights | None = None, prior_lists: float = 0.0,
              groups: list[int] | None = None, without: tuple[str, ...] = ("mlm",)) -> tuple[RerankWeights, dict]:
    """Fit one variant's weights and margin on described lists (the precision bounds kept in each of `groups`; the
    features named in `without` weighed 0: by default the masked LM's, which only lists a masked LM described hold,
    and whose weight, once not 0, makes the folder need that model to serve)."""
    names = Features.names()
    allowed = names if variant == "full" else LM_ONLY
    mask = np.array([n in allowed and n not in without for n in names], dtype=np.float64)
    w = fit_weights(lists, mask, prior=prior.vector() if prior is not None else None, prior_lists=prior_lists)
    margin, figures = pick_margin(lists, w, max_worse, max_right_changed, groups)
    weights = replace(RerankWeights(**dict(zip(names, map(float, w), strict=True))), margin=margin)
    return weights, figures | {"lists": len(lists)}


# the share of the held-out halves' errors the masked LM must take off to be weighed (`fit_with_masked_lm`)
MLM_MIN_GAIN = 0.005


def fit_with_masked_lm(lists: list[DevList], variant: str, max_worse: float, max_right_changed: float,
                       prior: RerankWeights | None = None, prior_lists: float = 0.0) -> tuple[RerankWeights, dict]:
    """`fit_lists` on lists a masked LM described (`dev_lists(..., masked_lm=...)`), its feature weighed only where it
    helps: the stage is fitted with and without it on each half of the lists (every other list) and scored on the other
    half; the masked LM keeps a weight only where those two held-out halves together have at least MLM_MIN_GAIN fewer
    errors with it (a model that knows nothing of the language, a random one, moves a few close calls either way and
    must cost nothing). Else the stage is the one fitted without it (its weight exactly 0, so the folder serves without
    the model). The figures say which, under "masked_lm"."""
    errors = {"with": 0, "without": 0}
    for held in (0, 1):
        fitted_on, scored_on = lists[1 - held :: 2], lists[held::2]
        for name, without in (("with", ()), ("without", ("mlm",))):
            w, _ = fit_lists(fitted_on, variant, max_worse, max_right_changed, prior, prior_lists, without=without)
            errors[name] += sum(_chosen_errors(d, w.vector(), w.margin) for d in scored_on)
    total = max(1, sum(d.truth_len for d in lists))
    record = {"cv_cer_with": errors["with"] / total, "cv_cer_without": errors["without"] / total,
              "note": "2-fold cross-validated over the lists the stage is fitted on"}
    if errors["with"] < (1 - MLM_MIN_GAIN) * errors["without"]:
        kept = fit_lists(lists, variant, max_worse, max_right_changed, prior, prior_lists, without=())
        if kept[0].mlm > 0:
            return kept[0], kept[1] | {"masked_lm": record | {"weighed": True}}
    weights, figures = fit_lists(lists, variant, max_worse, max_right_changed, prior, prior_lists)
    return weights, figures | {"masked_lm": record | {"weighed": False}}


def fitted_summary(stage: RerankWeights, figures: dict) -> str:
    """One line on a stage fitted on lists: their CER before and after, its margin, whether it weighs the masked LM
    (`fit_with_masked_lm`) and its rule pass."""
    out = (f"the lists fitted on: CER {figures['top1_cer']:.2%} (TOP1) -> {figures['cer']:.2%}, margin "
           f"{stage.margin:.2f}")
    if "masked_lm" in figures:
        m = figures["masked_lm"]
        out += (f"; the masked LM {'weighed' if m['weighed'] else 'not weighed'} (2-fold CER {m['cv_cer_with']:.2%} "
                f"with it, {m['cv_cer_without']:.2%} without)")
    if stage.rule_trust:
        out += (f"; rule pass: trust >= {stage.rule_trust:g}, lead of trigram + {stage.rule_domain:g} x domain >= "
                f"{stage.rule_margin:g}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="Fit the reranker's weights and margin on dev lists.")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS_DIR)
    ap.add_argument("--dev-sentences", type=int, default=3000)
    ap.add_argument("--decoded-sentences", type=int, default=0,
                    help="dev lists of the decoding recogniser (learn.data.decode_sim), added as a group of their own")
    ap.add_argument("--data", type=Path, action="append", default=[], help="labelled dev file(s), added")
    ap.add_argument("--variant", choices=("full", "lm"), default="full")
    ap.add_argument("--max-worse", type=float, default=0.003)
    ap.add_argument("--max-right-changed", type=float, default=0.003)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--margin-only", action="store_true", help="keep the current weights; choose the margin again")
    ap.add_argument("--gate", action="store_true",
                    help="keep the current weights and margin; fit the abstain gate that may keep TOP1 where they "
                         "would change it (learn.gate_fit; with --per-file: the bounds kept on each file alone)")
    ap.add_argument("--focus", action="store_true",
                    help="keep the current weights, margin and gate; choose the margin lists whose hypotheses vary "
                         "TOP1 at the same few places are answered at (model.gate.scatter; learn.gate_fit.fit_focus)")
    ap.add_argument("--per-file", action="store_true",
                    help="keep the precision bounds on the simulated lists, on the decoded ones and on each --data "
                         "file alone, not only on all of them together (a hard recogniser's few lists are not "
                         "outweighed)")
    ap.add_argument("--write", action="store_true",
                    help="store the weights in --weights' config.json (the shipped one unless named)")
    args = ap.parse_args()
    corrector = Corrector(args.weights, device="cpu")
    corrector.setup()
    nbests, truths = simulated_dev(args.corpus, args.dev_sentences, args.seed)
    origin = [0] * len(nbests)  # the simulated lists are group 0, the decoded ones 1, each --data file one of its own
    if args.decoded_sentences:
        decoded, decoded_truths = decoded_dev(args.corpus, args.decoded_sentences, args.dev_sentences, args.seed)
        nbests, truths, origin = nbests + decoded, truths + decoded_truths, origin + [1] * len(decoded)
    for group, path in enumerate(args.data, start=2):
        from learn.data.labelled import read_labelled

        items = read_labelled(path)
        nbests += [it.nbest for it in items]
        truths += [it.truth for it in items]
        origin += [group] * len(items)
    described = described_lists(corrector, nbests, truths, use_net=args.variant == "full",
                                adaptation=corrector.adaptation)
    lists = [d for d in described if d is not None]
    groups = [g for d, g in zip(described, origin, strict=True) if d is not None] if args.per_file else None
    for group, room in thin_bounds(lists, args.max_worse, args.max_right_changed, groups).items():
        name = "all the lists" if groups is None else (["the simulated lists", "the decoded lists", *args.data])[group]
        print(f"tune: warning: {name}: {room}; figures this small move by chance (more lists)", file=sys.stderr)
    meta = WeightsMeta.load(args.weights)
    current = meta.rerank.get(args.variant)
    gate = None
    if (args.margin_only or args.gate or args.focus) and current is None:
        sys.exit(f"tune: {args.weights} has no fitted {args.variant!r} stage to keep the weights of")
    if args.margin_only or args.gate or args.focus:  # the current weights kept; the margin (or the gate) chosen again
        kept = RerankWeights.from_dict(current.weights)
        if args.focus:
            if current.gate is None:
                sys.exit(f"tune: {args.weights}'s {args.variant!r} stage has no gate to add a focused regime to "
                         "(python -m learn.tune --gate first)")
            gate, figures = fit_focus(lists, kept.vector(), kept.margin, Gate.from_dict(current.gate),
                                      args.max_worse, args.max_right_changed, groups)
            margin = kept.margin
        elif args.gate:
            gate, figures = fit_gate(lists, kept.vector(), kept.margin, args.max_worse, args.max_right_changed, groups)
            if gate is None:
                sys.exit(f"tune: no gate keeps the precision bounds on these lists: {figures}")
            margin = kept.margin
        else:
            margin, figures = pick_margin(lists, kept.vector(), args.max_worse, args.max_right_changed, groups)
        weights, figures = replace(kept, margin=margin), figures | {"lists": len(lists)}
    else:
        weights, figures = fit_lists(lists, args.variant, args.max_worse, args.max_right_changed, groups=groups)
    if current is not None:
        current_gate = Gate.from_dict(current.gate) if current.gate is not None else None
        figures["current_stage_cer"] = stage_cer(lists, RerankWeights.from_dict(current.weights), current_gate)
        # a current stage that breaks the precision bounds on these lists is no stage to keep, whatever its CER
        figures["current_stage_breaks_bounds"] = breaks_bounds(lists, RerankWeights.from_dict(current.weights),
                                                               args.max_worse, args.max_right_changed, groups,
                                                               current_gate)
    print(json.dumps({"weights": weights.to_dict(), "gate": gate.to_dict() if gate else None, "dev": figures},
                     indent=1))
    if (args.write and current is not None and figures["cer"] > figures["current_stage_cer"]
            and not figures["current_stage_breaks_bounds"]):
        print(f"tune: the refit loses on the lists it was fitted on (CER {figures['cer']:.3%} against the current "
              f"stage's {figures['current_stage_cer']:.3%}): nothing was written", file=sys.stderr)
        sys.exit(1)
    if args.write:
        stage = RerankStage(weights.to_dict(), figures, gate.to_dict() if gate is not None else None)
        print(wrote(meta.with_stage(args.variant, stage).save(args.weights)))


if __name__ == "__main__":
    main()
