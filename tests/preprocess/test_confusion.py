from preprocess.confusion import NEAR, OTHER_TONE, SAME_TONE, ConfusionSet
from preprocess.phones import char_syllable

COUNTS = {c: n for n, c in enumerate("是事市時十使式試世石師詩施司四思死私絲斯資子字自", start=1)}


def test_confusion_similar_offers_same_syllable_first():
    cs = ConfusionSet(COUNTS)
    sims = cs.similar("是", limit=8)
    assert sims[0][1] == SAME_TONE
    assert all(char_syllable(c).toneless == "shi" for c, rel in sims if rel in (SAME_TONE, OTHER_TONE))


def test_confusion_similar_includes_near_syllables_sh_s():
    cs = ConfusionSet(COUNTS)
    sims = dict(cs.similar("是", limit=10))
    near = [c for c, rel in sims.items() if rel == NEAR]
    assert near and all(char_syllable(c).toneless == "si" for c in near)


def test_confusion_similar_never_offers_the_character_itself():
    cs = ConfusionSet(COUNTS)
    assert "是" not in dict(cs.similar("是"))


def test_confusion_near_syllable_covers_nasal_codas():
    cs = ConfusionSet({"陳": 5, "成": 3, "晨": 2})
    assert "成" in cs.near_syllable("陳")
