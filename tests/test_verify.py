import numpy as np

from hstu_replay.verify import compare, largest_difference


def test_names_the_worst_user_and_difference():
    ref = np.zeros((5, 8), np.float32)
    out = ref.copy()
    out[3, 2] = 0.5  # row 3 belongs to user 1 (candidates 2, 3)
    v = compare(out, ref, np.array([2, 3]), 0.0625)
    assert not v.ok and v.worst_user == 1 and v.max_abs_diff == 0.5


def test_within_tolerance_passes_and_nan_fails():
    ref = np.ones((2, 8), np.float32)
    assert compare(ref + 0.06, ref, np.array([2])).ok
    bad = ref.copy()
    bad[0, 0] = np.nan
    assert not compare(bad, ref, np.array([2])).ok


def test_shape_mismatch_is_a_failure():
    v = compare(np.zeros((2, 8), np.float32), np.zeros((3, 8), np.float32), np.array([3]))
    assert not v.ok and "shape" in v.reason


def test_the_largest_difference_is_named_by_user_candidate_and_task():
    # two users: 2 candidates, then 3; the largest difference is at row 3 (user 1's candidate 1), task 5
    reference = np.zeros((5, 8), dtype=np.float32)
    logits = reference.copy()
    logits[0, 0] = 0.25
    logits[3, 5] = -0.75
    worst = largest_difference(logits, reference, np.array([2, 3]))
    assert (worst.user, worst.candidate, worst.task, worst.expected, worst.got, worst.size) == (1, 1, 5, 0.0, -0.75, 0.75)
    assert worst.line(0.0625) == "candidate 1, task 5: expected 0, got -0.75 (|diff| 0.75 > tolerance 0.0625)"
    logits[1, 2] = np.nan  # a NaN answer is the largest difference there is
    nan = largest_difference(logits, reference, np.array([2, 3]))
    assert (nan.user, nan.candidate, nan.task, nan.size) == (0, 1, 2, float("inf"))
    assert largest_difference(np.zeros((0, 8)), np.zeros((0, 8)), np.array([0])) is None
