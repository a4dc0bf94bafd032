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
    assert old.gate is None and old.rules[0].trust is None and old.rules[0].weight == old.rules[0].rate


def test_with_gate_returns_the_same_rules_behind_another_gate_and_leaves_the_original_as_it_was():
    trusted = Rule("台", "臺", False, 8, 10, held_count=7, held_seen=10, trust=0.6)
    doubtful = Rule("在", "再", False, 3, 10, held_count=1, held_seen=10, trust=0.2)
    open_gate = Confusions([trusted, doubtful], gate=0.1)
    closed = open_gate.with_gate(0.5)
    assert closed is not open_gate and closed.rules == open_gate.rules
    assert open_gate.gate == 0.1 and open_gate.acts(doubtful)
    assert closed.gate == 0.5 and closed.acts(trusted) and not closed.acts(doubtful)
