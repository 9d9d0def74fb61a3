import numpy as np

from hstu_replay.verify import compare


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
