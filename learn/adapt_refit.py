"""`learn.adapt`'s steps 2 and 4: the domain LM and the recogniser's confusions learned from lists
(`learn_lm_and_confusions`), and the second stage refitted with them (`refit`) on the dev lists and the train lists
cross-fitted (`cross_fitted_folds`: each fold described by what the other folds taught), once per trust floor of
`learn.rule_trust.TRUST_FLOORS` (the least trust that lets a rule act), with a team's masked LM where one is given.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from learn.adapt_data import nbests
from learn.adapt_settings import AdaptSettings
from learn.data.labelled import Labelled, Split
from learn.domain_lm import build_domain_lm, save_confusions
from learn.memo_baseline import agreement_scorer
from learn.rule_trust import TRUST_FLOORS, learn_confusions
from learn.tune import dev_lists, fit_lists, fit_with_masked_lm, fitted_summary, pick_rule_pass
from model.adaptation import CONFUSIONS_FILE, DOMAIN_LM_FILE, Adaptation, Conventions, DomainLM
from model.corrector import Corrector
from model.lm import LanguageModel
from model.masked_lm import MaskedLM
from model.rerank import RerankWeights
from model.weights_meta import RERANK_STAGES, RerankStage, WeightsMeta
from preprocess.rules import Confusions
from preprocess.text import NBest, han_chars


def learn_lm_and_confusions(items: list[Labelled], out: Path, settings: AdaptSettings, lm: LanguageModel,
                            floor: float | None = None) -> tuple[dict[str, int], Confusions]:
    """Build the domain LM and learn the confusions of `items` into `out` (each rule's trust measured in
    `settings.folds` folds, where the language models prefer its rewrite unless `settings.trust` says everywhere;
    `floor` the trust floor: the least trust that lets a rule act)."""
    truths = [han_chars(it.truth) for it in items]
    lm_counts = build_domain_lm(truths, out / DOMAIN_LM_FILE)
    pairs = [(han_chars(it.nbest.top1), truth) for it, truth in zip(items, truths, strict=True)]
    confusions = learn_confusions([p for p in pairs if p[0] and p[1]], min_count=settings.min_count,
                                  folds=max(2, settings.folds), seed=settings.seed, floor=floor,
                                  scorer=agreement_scorer(lm) if settings.trust == "agreed" else None)
    save_confusions(confusions, out / CONFUSIONS_FILE)
    return lm_counts, confusions


def fold_of(item_id: str, seed: int, folds: int) -> int:
    return int.from_bytes(hashlib.sha256(f"fold:{seed}:{item_id}".encode()).digest()[:8], "big") % folds


@dataclass
class Fold:
    """One fold of the train lists, with the domain LM and confusions the other folds taught."""

    adaptation: Adaptation
    lists: list[NBest]
    truths: list[str]


def cross_fitted_folds(settings: AdaptSettings, train: list[Labelled], corrector: Corrector, tmp: Path) -> list[Fold]:
    """The train lists cut in folds, each with the domain LM and confusions learned from the other folds (never from
    itself); their files in `tmp`."""
    if settings.folds < 2 or len(train) < settings.folds:
        return []
    out: list[Fold] = []
    for k in range(settings.folds):
        held = [it for it in train if fold_of(it.id, settings.seed, settings.folds) == k]
        rest = [it for it in train if fold_of(it.id, settings.seed, settings.folds) != k]
        part = tmp / f"fold{k}"
        part.mkdir()
        assert corrector.lm is not None
        _, confusions = learn_lm_and_confusions(rest, part, settings, corrector.lm)
        adaptation = Adaptation(DomainLM(part / DOMAIN_LM_FILE), confusions,
                                Conventions.from_confusions(confusions, corrector.lm.to_simplified))
        out.append(Fold(adaptation, nbests(held), [han_chars(it.truth) for it in held]))
    return out


def refit(settings: AdaptSettings, adapted: Corrector, split: Split,
          masked_lm: MaskedLM | None = None) -> tuple[dict[str, RerankStage], float, Confusions]:
    """Fit the rules' trust floor and the second stage's two variants on the dev lists and the cross-fitted train
    lists: for each floor of `TRUST_FLOORS`, the lists described with the rules it lets act, the stage fitted on them;
    the floor with the lowest CER on those lists (the higher on a tie) is kept. With `masked_lm`, the full stage
    weighs its feature where that helps (`learn.tune.fit_with_masked_lm`). Return the stages, the floor and the
    adapted folder's confusions under it (a new `Confusions`: the corrector's and the folds' are left as they are)."""
    assert adapted.adaptation is not None
    dev_nb, dev_truths = nbests(split.dev), [han_chars(it.truth) for it in split.dev]
    shipped_stages = WeightsMeta.load(settings.init_from).rerank
    priors = {v: RerankWeights.from_dict(shipped_stages[v].weights) if v in shipped_stages else None
              for v in RERANK_STAGES}
    served = adapted.adaptation.confusions
    tried: list[tuple[float, RerankWeights, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folds = cross_fitted_folds(settings, split.train, adapted, Path(tmp))
        for floor in TRUST_FLOORS:
            floored = _under_floor(adapted.adaptation, floor)
            lists = dev_lists(adapted, dev_nb, dev_truths, use_net=True, adaptation=floored, masked_lm=masked_lm)
            for f in folds:
                lists += dev_lists(adapted, f.lists, f.truths, use_net=True,
                                   adaptation=_under_floor(f.adaptation, floor), masked_lm=masked_lm)
            stage, stage_figures = (fit_lists if masked_lm is None else fit_with_masked_lm)(
                lists, "full", settings.max_worse, settings.max_right_changed, priors["full"], settings.prior_lists)
            if settings.rule_pass:
                stage, ruled = pick_rule_pass(lists, stage, settings.max_worse, settings.max_right_changed)
                stage_figures |= ruled
            acting = sum(map(floored.confusions.acts, served.rules))
            print(f"    trust floor {floor:g}: {acting} of {len(served)} rules act; "
                  f"{fitted_summary(stage, stage_figures)}")
            tried.append((floor, stage, stage_figures))
    floor, full, full_figures = min(reversed(tried), key=lambda t: t[2]["cer"])
    kept = _under_floor(adapted.adaptation, floor)
    lm_lists = dev_lists(adapted, dev_nb, dev_truths, use_net=False, adaptation=kept)
    lm_only, lm_figures = fit_lists(lm_lists, "lm", settings.max_worse, settings.max_right_changed, priors["lm"],
                                    settings.prior_lists)
    fitted_on = "fitted on these lists (dev, and the train lists cross-fitted), not held out"
    print(f"    trust floor {floor:g} kept; the lists fitted on (not held out): CER {full_figures['top1_cer']:.2%} "
          f"(TOP1) -> {full_figures['cer']:.2%}; weights {json.dumps(full.to_dict())}")
    by_floor = {f"{f:g}": figs["cer"] for f, _, figs in tried}
    stages = {"full": RerankStage(full.to_dict(), full_figures | {"note": fitted_on, "trust_floor": floor,
                                                                  "cer_by_trust_floor": by_floor}),
              "lm": RerankStage(lm_only.to_dict(), lm_figures | {"note": "fitted on the dev lists"})}
    return stages, floor, kept.confusions


def _under_floor(adaptation: Adaptation, floor: float) -> Adaptation:
    """`adaptation` with its confusions under the trust floor `floor` (a new Adaptation and Confusions; the given one
    unchanged)."""
    return replace(adaptation, confusions=adaptation.confusions.with_floor(floor))
