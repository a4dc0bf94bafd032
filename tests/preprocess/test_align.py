from preprocess.align import align_nbest, align_to


def test_align_to_pairs_equal_lengths_position_by_position():
    assert align_to("我發現新元", "我發現新原") == ["我", "發", "現", "新", "原"]


def test_align_to_marks_a_deletion_as_empty_segment():
    assert align_to("央行進場", "央行場") == ["央", "行", "", "場"]


def test_align_to_attaches_an_insertion_to_the_previous_position():
    assert align_to("你好密碼", "你好的密碼") == ["你", "好的", "密", "碼"]


def test_align_to_attaches_a_leading_insertion_to_the_first_position():
    assert align_to("你好", "喂你好") == ["喂你", "好"]


def test_align_to_handles_unequal_length_replacement():
    segs = align_to("買回調接", "買掉")
    assert len(segs) == 4
    assert "".join(segs) == "買掉"


def test_align_nbest_treats_segmentation_only_differences_as_equal():
    from preprocess.text import han_chars

    top1 = han_chars("央行 進場 買 回調 接")
    rows = align_nbest(top1, [han_chars("央行 進場 買回 調 接"), han_chars("央 行 進 場 買 回 調 接")])
    assert rows == [list(top1), list(top1)]


def test_align_to_rebuilds_the_hypothesis_exactly():
    for top1, hyp in [("abcdef", "xbcdyf"), ("abc", ""), ("abc", "abcabc"), ("a", "zzz")]:
        assert "".join(align_to(top1, hyp)) == hyp


def test_align_nbest_gives_each_hypothesis_its_own_row_as_align_to_does():
    """align_nbest shares TOP1's characters between its rows (issue 61): each row is still its own list, equal to the
    hypothesis aligned alone, whatever its edits (random strings over a few characters: many of each kind)."""
    import random

    rng = random.Random(3)
    for _ in range(500):
        top1 = "".join(rng.choice("我們你他的是在") for _ in range(rng.randint(1, 12)))
        hyps = ["".join(rng.choice("我們你他的是在") for _ in range(rng.randint(0, 14))) for _ in range(4)]
        rows = align_nbest(top1, [*hyps, top1])
        assert rows == [align_to(top1, h) for h in [*hyps, top1]]
        assert rows[-1] == list(top1)
        rows[0][0] = "x"
        assert rows[-1][0] == top1[0] and align_nbest(top1, [top1]) == [list(top1)]
