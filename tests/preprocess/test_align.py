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
