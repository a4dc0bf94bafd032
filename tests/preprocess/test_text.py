from preprocess.phones import char_syllable, text_phones
from preprocess.text import han_chars, has_han, top1_answer


def test_top1_answer_removes_spaces_and_non_chinese_tokens():
    assert top1_answer(["喂 你好 密碼 waa 進去 <htr> 5g"]) == "喂你好密碼進去"


def test_top1_answer_keeps_formal_numerals():
    assert top1_answer(["匯款 壹 萬 貳 仟 元"]) == "匯款壹萬貳仟元"


def test_top1_answer_never_empty_when_top1_has_characters():
    assert top1_answer(["while e-mail"]) == "whilee-mail"


def test_top1_answer_of_empty_list_is_empty():
    assert top1_answer([]) == ""


def test_han_chars_drops_punctuation_and_digits():
    assert han_chars("好 . 123 abc 的") == "好的"


def test_text_phones_spells_the_judges_notation():
    # from docs/contract.md (the phone notation): 見 = ts6 j A: n4, 成 = ttss_h ax N2, 是 = ss4, 的 = t ax5
    assert text_phones("見 成 是 的") == "ts6 j A: n4 ttss_h ax N2 ss4 t ax5"


def test_text_phones_spells_htr_as_spn():
    assert text_phones("我 <htr> 要") == "w O:3 spn j aU4"


def test_char_syllable_is_none_for_non_chinese():
    assert char_syllable("a") is None


def test_han_chars_keeps_ling_zero_and_extension_b_characters():
    assert han_chars("二〇二二 年") == "二〇二二年"
    assert han_chars("𠀋 好") == "𠀋好"  # U+2000B, CJK extension B


def test_has_han_says_whether_any_han_character_is_left_by_han_chars():
    for text in ("好 . 123", "<htr> abc 1", "", "二〇", "𠀋", "ok"):
        assert has_han(text) == bool(han_chars(text))
