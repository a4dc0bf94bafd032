"""model.gate: the abstain gate's features of a candidate in its list, and its veto in the second stage."""

import numpy as np
import pytest

from config import DEFAULT_WEIGHTS_DIR
from model.gate import CONTEXT_FEATURES, GATE_FEATURES, Gate, context, scatter
from model.rerank import Features, Reranker, RerankWeights, candidates
from model.weights_meta import WeightsMeta
from preprocess.text import NBest

pytestmark = pytest.mark.real_model

LM_ONLY = RerankWeights(lm=1.0, margin=0.0)


def _described(featurizer, lm, *sentences):
    example = featurizer.featurize(NBest(tuple(sentences)))
    cands = candidates(example, None)
    rows = np.array(Reranker(lm, LM_ONLY).rows(example, None, cands))
    return example, cands, rows, context(example, rows, [c.choice for c in cands], Features.names())


def test_context_counts_how_many_other_hypotheses_hold_each_change(featurizer, lm):
    example, cands, rows, ctx = _described(featurizer, lm, "今天 故價 上漲", "今天 股價 上漲", "今天 股價 上漲",
                                           "今天 鼓架 上漲")
    col = {n: i for i, n in enumerate(CONTEXT_FEATURES)}
    held_by_two = [c.text for c in cands].index("今天股價上漲")
    held_by_one = [c.text for c in cands].index("今天鼓架上漲")
    assert ctx[held_by_two, col["support_mean"]] == pytest.approx(2 / 3)
    assert ctx[held_by_one, col["support_min"]] == pytest.approx(1 / 3)  # 鼓 held by one of three, 架 by one
    assert ctx[0, col["support_mean"]] == 0.0  # TOP1 changes nothing
    assert ctx[0, col["several"]] == 1.0
    assert ctx[held_by_two, col["changes"]] == rows[held_by_two, Features.names().index("changes")] == 1.0


def test_context_of_a_top1_alone_list_has_no_support(featurizer, lm):
    _, _, _, ctx = _described(featurizer, lm, "今天 故價 上漲")
    col = {n: i for i, n in enumerate(CONTEXT_FEATURES)}
    assert ctx[:, [col["several"], col["support_min"], col["support_mean"]]].sum() == 0.0


def test_context_for_chosen_candidates_equals_their_rows_of_the_whole(featurizer, lm):
    example, cands, rows, ctx = _described(featurizer, lm, "今天 故價 上漲", "今天 股價 上漲", "今天 鼓架 上漲")
    one = context(example, rows, [c.choice for c in cands], Features.names(), [2])
    assert np.array_equal(one[0], ctx[2])


def test_a_gate_that_asks_for_support_vetoes_a_change_only_one_hypothesis_holds(featurizer, lm):
    example = featurizer.featurize(NBest(("今天 故價 上漲", "今天 股價 上漲", "今天 故價 上漲", "今天 故價 上漲")))
    assert Reranker(lm, LM_ONLY).choose(example, None) == "今天股價上漲"
    strict = Gate({"support_mean": 1.0}, margin=0.5)  # half the other hypotheses must hold the change
    assert Reranker(lm, LM_ONLY, gate=strict).choose(example, None) == "今天故價上漲"
    lenient = Gate({"support_mean": 1.0}, margin=0.3)
    assert Reranker(lm, LM_ONLY, gate=lenient).choose(example, None) == "今天股價上漲"


def test_a_gate_never_answers_what_the_margin_refuses(featurizer, lm):
    example = featurizer.featurize(NBest(("今天 故價 上漲", "今天 股價 上漲")))
    admits_all = Gate({"lead": 0.0}, margin=-1.0)
    assert Reranker(lm, RerankWeights(lm=1.0, margin=1e9), gate=admits_all).choose(example, None) == "今天故價上漲"


def test_gate_refuses_an_unknown_feature_and_reads_back_what_it_writes():
    with pytest.raises(ValueError, match="unknown features"):
        Gate({"acoustic": 1.0})
    gate = Gate({n: float(k) for k, n in enumerate(GATE_FEATURES)}, margin=2.5)
    assert Gate.from_dict(gate.to_dict()) == gate
    assert "focus_scatter" not in gate.to_dict()  # a folder written before the focused regime reads the same
    assert gate.vector().tolist() == [float(k) for k in range(len(GATE_FEATURES))]
    focused = Gate(gate.weights, 2.5, focus_scatter=2.0, focus_margin=1.5)
    assert Gate.from_dict(focused.to_dict()) == focused


def test_scatter_is_about_one_where_the_hypotheses_vary_one_stretch_and_grows_where_each_changes_its_own(featurizer):
    one_stretch = featurizer.featurize(NBest(("今天 股價 大漲 了", "今天 古價 大漲 了", "今天 鼓架 大漲 了",
                                              "今天 股架 大漲 了")))
    assert scatter(one_stretch) == pytest.approx(1.5)  # 2 places, against 4 changes over 3 hypotheses
    scattered = featurizer.featurize(NBest(("今天 股價 大漲 了", "金天 股價 大漲 了", "今天 股價 打漲 了",
                                            "今天 股價 大漲 啦")))
    assert scatter(scattered) == pytest.approx(3.0)  # each of 3 hypotheses changes a place of its own
    assert scatter(featurizer.featurize(NBest(("今天 股價 大漲",)))) == 0.0
    assert scatter(featurizer.featurize(NBest(("今天 股價 大漲", "今天 股價 大漲")))) == 0.0


def test_a_focused_list_is_answered_at_the_focus_margin_and_a_scattered_one_as_before(featurizer, lm):
    focused = featurizer.featurize(NBest(("今天 故價 上漲", "今天 股價 上漲", "今天 鼓價 上漲")))
    scattered = featurizer.featurize(NBest(("今天 故價 上漲", "今天 股價 上漲", "金天 故價 上漲", "今天 故價 上帳")))
    stage = RerankWeights(lm=1.0, margin=1e9)  # no lead reaches the stage's own margin
    regime = Gate({"lead": 1.0}, margin=-1e9, focus_scatter=2.0, focus_margin=0.0)
    assert scatter(focused) < 2.0 <= scatter(scattered)
    assert Reranker(lm, stage, gate=regime).choose(focused, None) == "今天股價上漲"
    assert Reranker(lm, stage, gate=regime).choose(scattered, None) == "今天故價上漲"
    alone = featurizer.featurize(NBest(("今天 故價 上漲",)))  # its candidates are the network's: not focused
    assert not regime.focused(alone) and Reranker(lm, stage, gate=regime).choose(alone, None) == "今天故價上漲"
    # the focus margin alone decides a focused list: the gate's own score is not asked
    out_of_reach = Gate({"lead": 1.0}, margin=1e9, focus_scatter=2.0, focus_margin=1e9)
    assert Reranker(lm, RerankWeights(lm=1.0, margin=0.0), gate=out_of_reach).choose(focused, None) == "今天故價上漲"


def test_the_shipped_full_stage_has_a_gate_the_corrector_serves():
    from model.corrector import Corrector

    stage = WeightsMeta.load(DEFAULT_WEIGHTS_DIR).rerank["full"]
    assert stage.gate is not None and set(stage.gate["weights"]) == set(GATE_FEATURES)
    corrector = Corrector(device="cpu")
    corrector.setup()
    assert corrector.reranker is not None and corrector.reranker.gate == Gate.from_dict(stage.gate)
