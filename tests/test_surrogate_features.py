"""Configurations of any Kernel Tuner space become numeric features, derived from values alone."""

from __future__ import annotations

import numpy as np

from kernelscout.tools.surrogates.features import ConfigEncoder

TUNE = {
    "block_size_x": [16, 32, 48, 64],
    "unroll": [0, 1],
    "scale": [0.5, 1.5],
    "layout": ["row", "col", "tiled"],
    "constant": [7],
}


def _configs() -> list[dict]:
    return [
        {"block_size_x": 48, "unroll": 1, "scale": 0.5, "layout": "col", "constant": 7},
        {"block_size_x": 64, "unroll": 0, "scale": 1.5, "layout": "tiled", "constant": 7},
    ]


def test_constant_parameters_carry_no_features() -> None:
    enc = ConfigEncoder(TUNE)
    assert "constant" not in enc.varying_params
    assert enc.param_names[-1] == "constant"  # still part of a config's identity


def test_string_values_are_encoded_by_their_position_in_the_space() -> None:
    enc = ConfigEncoder(TUNE)
    raw = enc.values_matrix(_configs())
    layout = enc.varying_params.index("layout")
    assert raw[:, layout].tolist() == [1.0, 2.0]
    unknown = enc.values_matrix([{**_configs()[0], "layout": "diagonal"}])
    assert unknown[0, layout] == -1.0


def test_power_of_two_structure_separates_48_from_64() -> None:
    """48 and 64 are neighbours in value but not in hardware terms: 64 is a power of two, 48 is not."""
    enc = ConfigEncoder({"block_size_x": [16, 32, 48, 64], "other": [1, 2]})
    x = enc.transform([{"block_size_x": b, "other": 1} for b in (16, 32, 48, 64)]).compact
    # compact columns per integer parameter: log2, 2-adic valuation, log2 of the odd part
    log2, valuation, odd = x[:, 0], x[:, 1], x[:, 2]
    assert log2.tolist() == [4.0, 5.0, np.log2(48), 6.0]
    assert valuation.tolist() == [4.0, 5.0, 4.0, 6.0]
    assert odd.tolist() == [0.0, 0.0, np.log2(3), 0.0]


def test_dicts_and_value_rows_encode_the_same() -> None:
    enc = ConfigEncoder(TUNE)
    rows = np.asarray([[c[n] for n in enc.param_names] for c in _configs()], dtype=object)
    a, b = enc.transform(_configs()), enc.transform(rows)
    np.testing.assert_array_equal(a.full, b.full)
    np.testing.assert_array_equal(a.compact, b.compact)


def test_rich_features_add_pairwise_products_raw_does_not() -> None:
    rich = ConfigEncoder(TUNE).transform(_configs())
    raw = ConfigEncoder(TUNE, rich=False).transform(_configs())
    assert raw.full.shape == (2, 4)
    log_product = np.log2([48 * 0.5, 64 * 1.5])  # block_size_x * scale, the only positive pair
    assert any(np.allclose(col, log_product) for col in rich.full.T)
    assert not any(np.allclose(col, log_product) for col in raw.full.T)
    assert np.isfinite(rich.full).all() and np.isfinite(rich.compact).all()


def test_thread_blocks_are_charged_for_whole_warps_and_wavefronts() -> None:
    """A 16x5x2 block (160 threads) fills five 32-lane warps exactly but pays for 192 lanes on 64-lane
    wavefronts; block_size_z has one value and still multiplies the threads."""
    enc = ConfigEncoder({"block_size_x": [16, 32], "block_size_y": [5, 8], "block_size_z": [2], "tile": [1, 2]})
    configs = [{"block_size_x": 16, "block_size_y": 5, "block_size_z": 2, "tile": 1},
               {"block_size_x": 32, "block_size_y": 8, "block_size_z": 2, "tile": 1}]
    blocks = enc.transform(configs)
    log_threads, warp_use, wavefront_use = blocks.compact[:, -3:].T
    assert log_threads.tolist() == [np.log2(160), np.log2(512)]
    assert warp_use.tolist() == [160 / 160, 1.0]
    assert wavefront_use.tolist() == [160 / 192, 1.0]
    np.testing.assert_array_equal(blocks.full[:, -3:], blocks.compact[:, -3:])


def test_lane_use_of_a_single_block_dimension() -> None:
    enc = ConfigEncoder({"block_size_x": [48, 64, 80], "other": [1, 2]})
    x = enc.transform([{"block_size_x": b, "other": 1} for b in (48, 64, 80)]).compact
    warp_use, wavefront_use = x[:, -2:].T  # one dimension: log2(threads) would repeat block_size_x's own column
    assert warp_use.tolist() == [48 / 64, 1.0, 80 / 96]
    assert wavefront_use.tolist() == [48 / 64, 1.0, 80 / 128]


def test_no_thread_block_columns_without_block_size_parameters() -> None:
    with_blocks = ConfigEncoder({"block_size_x": [32, 48], "tile": [1, 2]}).transform([{"block_size_x": 32, "tile": 1}])
    without = ConfigEncoder({"threads": [32, 48], "tile": [1, 2]}).transform([{"threads": 32, "tile": 1}])
    assert with_blocks.compact.shape[1] == without.compact.shape[1] + 2


# A dedispersion-like space: a stride only exists when the tile is larger than 1 (Kernel Tuner
# restriction `tile_size_x > 1 or tile_stride_x == 0`), and padding needs shared memory.
STRIDED = {"tile_size_x": [1, 2, 4], "tile_stride_x": [0, 1], "use_shmem": [0, 1], "use_padding": [0, 1]}


def _strided_space() -> list[tuple]:
    return [(t, s, m, p) for t in STRIDED["tile_size_x"] for s in STRIDED["tile_stride_x"]
            for m in STRIDED["use_shmem"] for p in STRIDED["use_padding"]
            if (t > 1 or s == 0) and (p == 0 or m == 1)]


def test_a_switch_forced_off_is_encoded_as_not_applying() -> None:
    """With tile 1 the stride is no choice: encoded as neither setting, so that a model that has seen
    'stride 0 is slow' on large tiles does not carry that to tile-1 configurations."""
    enc = ConfigEncoder(STRIDED, valid=_strided_space())
    plain = ConfigEncoder(STRIDED)
    tile1 = {"tile_size_x": 1, "tile_stride_x": 0, "use_shmem": 1, "use_padding": 0}
    stride0, stride1 = (plain.transform([{**tile1, "tile_size_x": 2, "tile_stride_x": s}]).full for s in (0, 1))
    got = enc.transform([tile1, {**tile1, "tile_size_x": 2}]).full
    expected = (plain.transform([{**tile1, "tile_stride_x": 0}]).full + plain.transform([{**tile1, "tile_stride_x": 1}]).full) / 2
    np.testing.assert_allclose(got[0], expected[0])
    np.testing.assert_array_equal(got[1], stride0[0])  # a tile of 2 chose its stride: encoded as is
    assert not np.array_equal(stride0, stride1)


def test_a_switch_forced_on_is_a_real_choice() -> None:
    """Padding forces shared memory on: shared memory is then in use, not inapplicable. Padding,
    forced off without shared memory, does not apply there."""
    enc = ConfigEncoder(STRIDED, valid=_strided_space())
    plain = ConfigEncoder(STRIDED)
    padded = {"tile_size_x": 2, "tile_stride_x": 1, "use_shmem": 1, "use_padding": 1}
    np.testing.assert_array_equal(enc.transform([padded]).full, plain.transform([padded]).full)
    no_shmem = {**padded, "use_shmem": 0, "use_padding": 0}
    assert not np.array_equal(enc.transform([no_shmem]).full, plain.transform([no_shmem]).full)


def test_switches_forced_off_together_are_averaged_over_all_their_settings() -> None:
    enc = ConfigEncoder(STRIDED, valid=_strided_space())
    plain = ConfigEncoder(STRIDED)
    both = {"tile_size_x": 1, "tile_stride_x": 0, "use_shmem": 0, "use_padding": 0}
    settings = [{**both, "tile_stride_x": s, "use_padding": p} for s in (0, 1) for p in (0, 1)]
    np.testing.assert_allclose(enc.transform([both]).full[0], plain.transform(settings).full.mean(axis=0))


def test_without_the_valid_space_every_value_is_encoded_as_given() -> None:
    tile1 = {"tile_size_x": 1, "tile_stride_x": 0, "use_shmem": 1, "use_padding": 0}
    np.testing.assert_array_equal(ConfigEncoder(STRIDED).transform([tile1]).full,
                                  ConfigEncoder(STRIDED, valid=[]).transform([tile1]).full)
