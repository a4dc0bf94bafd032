"""preprocess.rules: a recogniser's confusions learned from (TOP1, truth) pairs, with counts and rates."""

from preprocess.rules import Confusions, Span, edit_spans

PAIRS = [("痾我要查尋信用卡", "呃我要查詢信用卡"), ("痾你好", "呃你好"), ("我要查尋", "我要查詢"),
         ("我要查尋帳單", "我要查尋帳單"), ("我想辦卡", "呃我想辦卡"), ("我想問", "呃我想問")]


def test_edit_spans_merge_adjacent_edits_and_keep_insertions():
    assert edit_spans("abcd", "axcdd") == [Span(1, 2, "b", "x"), Span(3, 3, "", "d")]
    assert edit_spans("abcd", "axyd") == [Span(1, 3, "bc", "xy")]
    assert edit_spans("abc", "abc") == []


def test_confusions_rate_counts_every_time_the_recogniser_wrote_the_source():
    rules = {(r.source, r.target, r.in_context): r for r in Confusions.learn(PAIRS).rules}
    rule = rules[("尋", "詢", False)]
    assert (rule.count, rule.seen) == (2, 3)  # one TOP1 wrote 查尋 rightly
    assert rules[("痾", "呃", False)].rate == 1.0


def test_confusions_anchor_an_insertion_in_its_context():
    rules = {(r.source, r.target, r.in_context): r for r in Confusions.learn(PAIRS).rules}
    assert ("^我", "^呃我", True) in rules  # a filler the recogniser dropped before 我 at the start


def test_confusions_drop_rules_seen_fewer_than_min_count():
    assert len(Confusions.learn(PAIRS, min_count=3)) == 0


def test_rewrites_offer_each_rule_then_the_likeliest_together():
    rewrites = Confusions.learn(PAIRS).rewrites("痾我要查尋")
    assert "痾我要查詢" in rewrites and "呃我要查尋" in rewrites and "呃我要查詢" in rewrites


def test_evidence_weighs_known_edits_and_ignores_unknown_ones():
    confusions = Confusions.learn(PAIRS)
    assert confusions.evidence("我要查尋", "我要查詢") > 0
    assert confusions.evidence("我要查尋", "我要查找") == 0.0
    assert confusions.evidence("我要查尋", "我要查尋") == 0.0


def test_confusions_round_trip_through_their_saved_form():
    confusions = Confusions.learn(PAIRS)
    assert Confusions.from_dict(confusions.to_dict()).rules == confusions.rules
