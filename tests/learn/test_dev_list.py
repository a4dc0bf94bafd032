"""learn.dev_list: how many lists a fit's precision bounds leave room for, per group."""

import numpy as np

from learn.dev_list import MIN_BOUND_LISTS, DevList, thin_bounds


def _lists(n: int, right: int) -> list[DevList]:
    """n lists, the first `right` of them with a right TOP1."""
    return [DevList(np.zeros((1, 3)), np.array([0 if k < right else 2]), 10) for k in range(n)]


def test_a_bound_of_a_few_lists_is_said_per_group_and_a_roomy_one_is_not():
    small, large = _lists(1500, 770), _lists(20_000, 10_000)
    thin = thin_bounds(small + large, 0.005, 0.005, [2] * len(small) + [0] * len(large))
    assert list(thin) == [2]
    assert thin[2] == "0.50% of its 1500 lists is 7.5 made worse, 0.50% of its 770 right TOP1s is 3.9 changed"
    # without groups the lists are one group; its room is what the bounds allow on all of them
    assert thin_bounds(small, 0.005, 0.005) == {0: thin[2]}
    assert thin_bounds(large, 0.005, 0.005) == {}
    # room for exactly the fewest lists it should leave is enough
    assert thin_bounds(_lists(MIN_BOUND_LISTS * 100, MIN_BOUND_LISTS * 100), 0.01, 0.01) == {}
