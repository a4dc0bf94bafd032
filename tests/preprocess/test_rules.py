"""preprocess.rules: what a served folder's confusion rules offer (rewrites) and credit (evidence)."""

from learn.rule_trust import learn_confusions
from preprocess.rules import Confusions, Rule, Span, edit_spans

PAIRS = [("痾我要查尋信用卡", "呃我要查詢信用卡"), ("痾你好", "呃你好"), ("我要查尋", "我要查詢"),
         ("我要查尋帳單", "我要查尋帳單"), ("我想辦卡", "呃我想辦卡"), ("我想問", "呃我想問")]


def test_edit_spans_merge_adjacent_edits_and_keep_insertions():
    assert edit_spans("abcd", "axcdd") == [Span(1, 2, "b", "x"), Span(3, 3, "", "d")]
    assert edit_spans("abcd", "axyd") == [Span(1, 3, "bc", "xy")]
    assert edit_spans("abc", "abc") == []


def test_rewrites_offer_each_rule_then_the_likeliest_together():
    rewrites = learn_confusions(PAIRS).rewrites("痾我要查尋")
    assert "痾我要查詢" in rewrites and "呃我要查尋" in rewrites and "呃我要查詢" in rewrites


def test_evidence_weighs_known_edits_and_ignores_unknown_ones():
    confusions = learn_confusions(PAIRS)
    assert confusions.evidence("我要查尋", "我要查詢") > 0
    assert confusions.evidence("我要查尋", "我要查找") == 0.0
    assert confusions.evidence("我要查尋", "我要查尋") == 0.0


def test_confusions_round_trip_through_their_saved_form():
    confusions = learn_confusions(PAIRS)
    assert Confusions.from_dict(confusions.to_dict()).rules == confusions.rules


def test_rules_saved_before_trust_still_load_and_weigh_by_their_rate():
    old = Confusions.from_dict({"rules": [["尋", "詢", 0, 2, 3]]})
    assert old.floor is None and old.rules[0].trust is None and old.rules[0].weight == old.rules[0].rate


def test_the_trust_floor_is_saved_as_trust_floor_and_read_back():
    confusions = learn_confusions(PAIRS, folds=2, floor=0.3)
    saved = confusions.to_dict()

    assert saved["trust_floor"] == 0.3 and "gate" not in saved
    assert Confusions.from_dict(saved).floor == 0.3


def test_a_trust_floor_saved_as_gate_before_its_rename_still_loads_and_lets_the_same_rules_act():
    trusted = Rule("台", "臺", False, 8, 10, held_count=7, held_seen=10, trust=0.6)
    doubtful = Rule("在", "再", False, 3, 10, held_count=1, held_seen=10, trust=0.2)
    rows = [trusted.to_row(), doubtful.to_row()]

    old = Confusions.from_dict({"rules": rows, "gate": 0.5})
    new = Confusions.from_dict({"rules": rows, "trust_floor": 0.5})

    assert old.floor == new.floor == 0.5
    assert old.acts(trusted) and not old.acts(doubtful)
    assert old.rewrites("我在台北") == new.rewrites("我在台北") == ["我在臺北"]
    assert old.to_dict() == new.to_dict() and "gate" not in old.to_dict()


def test_with_floor_returns_the_same_rules_under_another_floor_and_leaves_the_original_as_it_was():
    trusted = Rule("台", "臺", False, 8, 10, held_count=7, held_seen=10, trust=0.6)
    doubtful = Rule("在", "再", False, 3, 10, held_count=1, held_seen=10, trust=0.2)
    low = Confusions([trusted, doubtful], floor=0.1)
    high = low.with_floor(0.5)
    assert high is not low and high.rules == low.rules
    assert low.floor == 0.1 and low.acts(doubtful)
    assert high.floor == 0.5 and high.acts(trusted) and not high.acts(doubtful)
