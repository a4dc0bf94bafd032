"""learn.rule_trust: a recogniser's confusions learned from (TOP1, truth) pairs, with counts, rates and trust."""

from learn.rule_trust import learn_confusions
from preprocess.rules import Confusions

PAIRS = [("痾我要查尋信用卡", "呃我要查詢信用卡"), ("痾你好", "呃你好"), ("我要查尋", "我要查詢"),
         ("我要查尋帳單", "我要查尋帳單"), ("我想辦卡", "呃我想辦卡"), ("我想問", "呃我想問")]


def test_confusions_rate_counts_every_time_the_recogniser_wrote_the_source():
    rules = {(r.source, r.target, r.in_context): r for r in learn_confusions(PAIRS).rules}
    rule = rules[("尋", "詢", False)]
    assert (rule.count, rule.seen) == (2, 3)  # one TOP1 wrote 查尋 rightly
    assert rules[("痾", "呃", False)].rate == 1.0


def test_confusions_anchor_an_insertion_in_its_context():
    rules = {(r.source, r.target, r.in_context): r for r in learn_confusions(PAIRS).rules}
    assert ("^我", "^呃我", True) in rules  # a filler the recogniser dropped before 我 at the start


def test_confusions_drop_rules_seen_fewer_than_min_count():
    assert len(learn_confusions(PAIRS, min_count=3)) == 0


def _recogniser_pairs() -> list[tuple[str, str]]:
    """A recogniser that always writes 卷 for 券."""
    pairs = []
    for k in range(200):
        truth = f"我有{k % 10}張優惠券" if k % 2 else f"我有{k % 7}個問題"
        pairs.append((truth.replace("券", "卷"), truth))
    return pairs


def test_trust_is_measured_out_of_fold():
    confusions = learn_confusions(_recogniser_pairs(), folds=5, seed=3)
    good = {(r.source, r.target, r.in_context): r for r in confusions.rules}[("卷", "券", False)]
    assert good.held_count == good.held_seen == 100 and good.trust is not None and good.trust > 0.9
    assert confusions.trusted()[0].trust == max(r.trust or 0 for r in confusions.rules)
    # a rule seen twice, in two folds: each fold's rewrite is scored by the rule the other fold saw
    pairs = [("我要查尋", "我要查詢")] * 2 + [("我要查尋帳單", "我要查尋帳單")] * 20
    learnt = learn_confusions(pairs, folds=2, seed=0)
    rule = {(r.source, r.target, r.in_context): r for r in learnt.rules}[("尋", "詢", False)]
    assert rule.count == 2 and rule.held_count in (0, 2) and rule.held_seen >= rule.held_count


def test_a_common_source_rarely_rewritten_is_trusted_little_and_the_trust_floor_stops_it():
    pairs = [("我的卡", "我的卡")] * 200 + [("我的卡", "我得卡")] * 6 + [("查尋", "查詢")] * 6
    confusions = learn_confusions(pairs, folds=5, seed=1, floor=0.2)
    rules = {(r.source, r.target, r.in_context): r for r in confusions.rules}
    weak, strong = rules[("的", "得", False)], rules[("尋", "詢", False)]
    assert weak.trust is not None and weak.trust < 0.1 < 0.9 < (strong.trust or 0)
    assert "我得卡" not in confusions.rewrites("我的卡") and "查詢" in confusions.rewrites("查尋")
    assert confusions.evidence("我的卡", "我得卡") == 0.0 < confusions.evidence("查尋", "查詢")


def test_trusted_rules_and_their_trust_floor_round_trip():
    confusions = learn_confusions(_recogniser_pairs(), folds=5, seed=3, floor=0.3)
    again = Confusions.from_dict(confusions.to_dict())
    assert again.rules == confusions.rules and again.floor == 0.3


def _bigram_scorer(truths: list[str]):
    """A scorer taught by truths: how many of a sentence's character bigrams the truths hold (a stand-in for the
    language models `learn.adapt` gives)."""
    from collections import Counter

    counts = Counter(t[i : i + 2] for t in truths for i in range(len(t) - 1))
    return lambda text: sum(counts[text[i : i + 2]] > 0 for i in range(len(text) - 1))


def test_trust_where_the_models_agree_counts_only_the_places_they_prefer_the_rewrite():
    # 有 → 又 is wrong in most places the recogniser writes 有, and right where the truths' bigrams prefer 又
    pairs = [("我有錢", "我有錢")] * 150 + [("有來了", "又來了")] * 30
    everywhere = {(r.source, r.target, r.in_context): r for r in learn_confusions(pairs, folds=5, seed=2).rules}
    agreed = {(r.source, r.target, r.in_context): r
              for r in learn_confusions(pairs, folds=5, seed=2, scorer=_bigram_scorer).rules}
    rule, where = everywhere[("有", "又", False)], agreed[("有", "又", False)]
    assert rule.trust is not None and rule.trust < 0.3
    assert where.trust is not None and where.trust > 0.8
    assert where.held_seen < rule.held_seen and where.held_count == rule.held_count == 30
    confusions = learn_confusions(pairs, folds=5, seed=2, floor=0.5, scorer=_bigram_scorer)
    assert "又來了" in confusions.rewrites("有來了")
