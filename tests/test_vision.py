"""Vision (sec. 12.4.1): patches as tokens, the ViT and its CNN baseline, the image readers
(digits, MNIST's IDX files, a folder of class folders), bad image input, and runs through the
entry point."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from src.data.image_files import read_digits, read_idx
from src.data.images import ImageDataModule, stratified_split
from src.models.image import CNN, CNNConfig, ViT, ViTConfig, load_classifier
from src.nn.patch import PatchEmbedding, grid_size, patchify, unpatchify
from src.nn.positional import (
    ConvPositionGenerator,
    RelativePositionBias2D,
    SinusoidalPositionalEncoding2D,
)
from src.utils.errors import PipelineError
from tests.conftest import MIRROR, ROOT, assert_ok, assert_one_error_line, run_module

NET = dict(n_layer=2, n_head=2, d_model=16, patch_size=4, dropout=0.0)
TINY = ["trainer.max_steps=30", "logger=csv", "callbacks.progress_bar.refresh_rate=0"]


@pytest.fixture(autouse=True)
def _seed(one_thread):
    torch.manual_seed(0)


# ---------------------------------------------------------------- patches


@pytest.mark.parametrize("size, patch", [((8, 8), 4), ((28, 28), 7), ((12, 20), 4), ((6, 9), 3)])
def test_patchify_then_unpatchify_is_the_identity(size, patch):
    x = torch.randn(2, 3, *size)
    p = patchify(x, patch)
    rows, cols = size[0] // patch, size[1] // patch
    assert p.shape == (2, rows * cols, 3 * patch * patch)
    assert torch.equal(unpatchify(p, size, patch), x)


def test_patches_are_in_raster_order_channel_by_channel():
    x = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(1, 2, 4, 6)  # C=2, H=4, W=6
    p = patchify(x, 2)  # a 2 x 3 grid
    n = 1 * 3 + 2  # row 1, column 2
    expected = torch.cat([x[0, c, 2:4, 4:6].flatten() for c in range(2)])
    assert torch.equal(p[0, n], expected)


@pytest.mark.parametrize(
    "size, patch, stride, grid", [((16, 16), 4, 4, (4, 4)), ((16, 16), 4, 2, (7, 7)),
                                  ((124, 100), 16, 6, (19, 15)), ((8, 8), 8, 1, (1, 1))]
)  # fmt: skip
def test_patch_count_follows_the_formula_with_overlap(size, patch, stride, grid):
    assert grid_size(size, patch, stride) == grid
    emb = PatchEmbedding(size, 1, patch, 8, stride)
    out = emb(torch.randn(3, 1, *size))
    assert out.shape == (3, grid[0] * grid[1], 8) and emb.num_patches == grid[0] * grid[1]


def test_a_patch_that_does_not_tile_the_image_is_one_clear_error():
    with pytest.raises(PipelineError, match="do not tile the image's width of 10"):
        PatchEmbedding((8, 10), 1, 4, 8)


def test_2d_sinusoidal_positions_encode_row_then_column():
    r = SinusoidalPositionalEncoding2D(8, (3, 4)).r.reshape(3, 4, 8)
    assert torch.equal(r[1, 0, :4], r[1, 3, :4]) and not torch.equal(r[0, 0, :4], r[1, 0, :4])
    assert torch.equal(r[0, 2, 4:], r[2, 2, 4:]) and not torch.equal(r[0, 0, 4:], r[0, 1, 4:])


def test_relative_biases_depend_on_the_offset_alone_and_not_on_the_class_token():
    rel = RelativePositionBias2D(2, (3, 4))
    torch.nn.init.normal_(rel.table)
    bias = rel()  # (H, 1 + 12, 1 + 12)
    assert bias.shape == (2, 13, 13) and not bias[:, 0].any() and not bias[:, :, 0].any()
    cell = bias[:, 1:, 1:].reshape(2, 3, 4, 3, 4)  # (H, row, col, row', col')
    assert torch.equal(cell[:, 0, 0, 1, 2], cell[:, 1, 1, 2, 3])  # the same offset (1, 2)
    assert not torch.equal(cell[:, 0, 0, 1, 2], cell[:, 0, 0, 2, 1])
    first = rel(cols=2)[:, 1:, 1:].reshape(2, 3, 2, 3, 2)  # the grid's first two columns
    assert torch.equal(first, cell[:, :, :2, :, :2])


def test_conv_positions_mix_each_cell_with_its_neighbours_alone_and_skip_padding():
    gen, x = ConvPositionGenerator(4), torch.randn(2, 1 + 3 * 5, 4)  # a 3 x 5 grid
    y = gen(x, (3, 5))
    assert torch.equal(y[:, 0], x[:, 0])  # the class token as it was
    moved = x.clone()
    moved[:, 1 + 5 * 1 + 1] += 1.0  # the cell at row 1, column 1
    changed = (gen(moved, (3, 5)) != y).any(-1)[:, 1:].reshape(2, 3, 5)
    assert changed[:, :, :3].all() and not changed[:, :, 3:].any()  # its 3 x 3 neighbourhood
    pad = torch.zeros(2, 1 + 15, dtype=torch.bool)
    pad[:, 1:] = (torch.arange(15) % 5 >= 3)[None]  # the last two columns are padding
    noisy = x.clone()
    noisy[:, 1:][pad[:, 1:]] = 1e3
    kept = ~pad[:, 1:]
    assert torch.allclose(gen(noisy, (3, 5), pad)[:, 1:][kept], gen(x, (3, 5), pad)[:, 1:][kept])


# ---------------------------------------------------------------- models


def vit(**kw) -> ViT:
    return ViT(ViTConfig(**{**NET, **kw}, image_size=(8, 8), channels=1, num_classes=10)).eval()


def shuffle_patches(x: torch.Tensor, patch: int, order: torch.Tensor) -> torch.Tensor:
    return unpatchify(patchify(x, patch)[:, order], tuple(x.shape[-2:]), patch)


def test_without_positions_the_class_token_ignores_the_patch_order():
    x, order = torch.randn(2, 1, 8, 8), torch.tensor([3, 1, 0, 2])
    moved = shuffle_patches(x, 4, order)
    plain = vit(pos_encoding="none")
    assert torch.allclose(plain(x), plain(moved), atol=1e-5)
    for placed in (vit(pos_encoding="learned"), vit(pos_encoding="none", relative_bias=True),
                   vit(pos_encoding="none", conv_positions=1)):  # fmt: skip
        if placed.rel is not None:  # zeros at first, as the relative biases start
            torch.nn.init.normal_(placed.rel.table)
        assert not torch.allclose(placed(x), placed(moved), atol=1e-3)
    with pytest.raises(PipelineError, match="conv_positions=3"):  # NET has 2 layers
        vit(conv_positions=3)


def test_the_class_token_output_alone_is_classified():
    net, x = vit(), torch.randn(2, 1, 8, 8)
    h = net.hidden(x)  # (B, 1 + N, D)
    assert h.shape == (2, 1 + 4, 16)
    assert torch.allclose(net(x), net.head(h[:, 0]))


def test_attention_rollout_mixes_in_the_residual_path_and_keeps_rows_stochastic():
    from src.nn.attention import attention_rollout

    uniform = torch.full((1, 2, 3, 3), 1 / 3)
    one = attention_rollout([uniform])[0]
    assert torch.allclose(one, 0.5 * torch.eye(3) + 1 / 6)
    many = attention_rollout([torch.softmax(torch.randn(2, 2, 5, 5), -1) for _ in range(3)])
    assert torch.allclose(many.sum(-1), torch.ones(2, 5))


def test_the_cnn_classifies_images_as_small_as_the_digits():
    cnn = CNN(CNNConfig(image_size=(8, 8), channels=1, num_classes=10, widths=(4, 8, 8, 8)))
    assert cnn(torch.randn(5, 1, 8, 8)).shape == (5, 10)


# ---------------------------------------------------------------- data


def write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_files_are_read_and_a_truncated_one_is_named(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (5, 3, 4))
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    assert np.array_equal(read_idx(tmp_path / "t10k-images-idx3-ubyte.gz"), images)
    short = tmp_path / "train-images-idx3-ubyte.gz"  # the header promises more than there is
    write_idx(short, images)
    short.write_bytes(gzip.compress(gzip.decompress(short.read_bytes())[:-7]))
    with pytest.raises(PipelineError, match=r"train-images-idx3-ubyte\.gz: truncated, 53 bytes"):
        read_idx(short)
    cut = tmp_path / "t10k-labels-idx1-ubyte.gz"  # a download cut short: a broken gzip stream
    cut.write_bytes((tmp_path / "t10k-images-idx3-ubyte.gz").read_bytes()[:-12])
    with pytest.raises(PipelineError, match=r"t10k-labels-idx1-ubyte\.gz: not a readable IDX"):
        read_idx(cut)


def test_stratified_split_keeps_every_class_in_proportion():
    y = np.repeat(np.arange(4), [50, 30, 10, 10])
    parts = stratified_split(y, (0.8, 0.1, 0.1), seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(100))
    assert np.bincount(y[parts[1]]).tolist() == [5, 3, 1, 1]


def module(tmp_path, **kw) -> ImageDataModule:
    dm = ImageDataModule(processed_dir=str(tmp_path / "processed"), raw_dir=str(tmp_path / "raw"),
                         mirror=str(MIRROR), **kw)  # fmt: skip
    dm.prepare_data()
    dm.setup()
    return dm


def test_digits_are_split_normalised_and_shifted_only_in_training(tmp_path):
    dm = module(tmp_path, shift=1)
    meta = dm.meta
    assert meta["image_size"] == [8, 8] and meta["channels"] == 1 and len(meta["classes"]) == 10
    assert sum(meta["images"].values()) == 1797
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (128, 1, 8, 8) and y.dtype == torch.long
    train = torch.stack([dm.splits["train"][i][0] for i in range(len(dm.splits["train"]))])
    assert abs(float(train.mean())) < 0.1  # shifted images bring in background, near 0 after all
    val = dm.splits["val"]
    assert torch.equal(val[0][0], val[0][0])  # no random shift outside training
    assert dm.model_kwargs == {"image_size": [8, 8], "channels": 1, "num_classes": 10}


def test_image_size_resizes_every_source(tmp_path):
    dm = module(tmp_path, image_size=[4, 4])  # ImageGPT's shorter window: 16 pixels, not 64
    assert dm.meta["image_size"] == [4, 4] and dm.model_kwargs["image_size"] == [4, 4]
    x, _ = next(iter(dm.val_dataloader()))
    assert x.shape == (128, 1, 4, 4)


def test_train_fraction_keeps_a_stratified_share_of_the_train_split(tmp_path):
    full, quarter = module(tmp_path), module(tmp_path, train_fraction=0.25)
    n, k = len(full.splits["train"]), len(quarter.splits["train"])
    assert abs(k - n / 4) <= 10 and len(quarter.splits["test"]) == len(full.splits["test"])
    counts = np.bincount(quarter.splits["train"].y, minlength=10)
    assert counts.min() >= 0.8 * counts.mean()


def test_a_folder_of_t10k_files_alone_is_split_80_10_10(tmp_path):
    mnist = MIRROR / "mnist" / "raw"
    if not (mnist / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip(f"dataset missing in the mirror: {mnist}")
    dm = module(tmp_path, source="mnist", root=str(mnist))
    with gzip.open(mnist / "t10k-labels-idx1-ubyte.gz") as f:  # 10,000, or the repository's sample
        n = int.from_bytes(f.read(8)[4:], "big")
    counts = dm.meta["images"]  # 80/10/10 of each digit's images, rounded per digit
    assert sum(counts.values()) == n
    shares = {"train": 0.8, "val": 0.1, "test": 0.1}
    assert all(abs(counts[s] - f * n) <= 5 for s, f in shares.items())
    assert dm.meta["image_size"] == [28, 28]


def write_png(path, size=(6, 6), value=0) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full(size, value, np.uint8)).save(path)


def test_a_folder_of_class_folders_is_read_with_its_class_names(tmp_path):
    for k, name in enumerate(["cat", "dog"]):
        for i in range(10):
            write_png(tmp_path / "pics" / name / f"{i}.png", value=40 * k + i)
    dm = module(tmp_path, source="folder", root=str(tmp_path / "pics"), mode="RGB")
    assert dm.meta["classes"] == ["cat", "dog"] and dm.meta["channels"] == 3
    assert sum(dm.meta["images"].values()) == 20


def write_jpegs(root, n: int, size=(20, 24), classes: int = 4) -> None:
    """n colour JPEGs of random noise in `classes` class folders."""
    from PIL import Image

    rng = np.random.default_rng(n)
    for i in range(n):
        path = root / f"c{i % classes}" / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)


def prepared(dm) -> dict:
    files = sorted(dm.processed_dir.iterdir())
    return {f.name: f.read_bytes() for f in files}


def test_a_folder_decoded_by_several_processes_in_chunks_is_the_same_as_by_one(tmp_path):
    write_jpegs(tmp_path / "pics", 50)
    kw = dict(source="folder", root=str(tmp_path / "pics"), mode="RGB", image_size=[16, 16])
    one = module(tmp_path / "one", **kw, num_proc=1, chunk=7)
    two = module(tmp_path / "two", **kw, num_proc=2, chunk=3)  # 17 jobs in 2 processes
    assert prepared(one) == prepared(two)
    assert np.load(one.processed_dir / "train_x.npy").shape == (40, 3, 16, 16)
    mean = np.load(one.processed_dir / "train_x.npy").mean(axis=(0, 2, 3))
    assert np.allclose(one.meta["mean"], mean)  # from the histogram of the train pixels


def as_image_dataset(root):
    """A folder's images as rows of a Hugging Face dataset, in read_folder's order: encoded
    images and a ClassLabel, as Hub image datasets hold them."""
    import datasets

    classes = sorted(d.name for d in root.iterdir())
    files = [(f, k) for k, c in enumerate(classes) for f in sorted((root / c).iterdir())]
    table = datasets.Dataset.from_dict({
        "img": [{"bytes": f.read_bytes(), "path": f.name} for f, _ in files],
        "label": [k for _, k in files],
    })  # fmt: skip
    table = table.cast_column("img", datasets.Image(decode=False))
    return table.cast_column("label", datasets.ClassLabel(names=classes))


def test_a_datasets_image_column_is_prepared_as_the_same_images_in_a_folder_are(tmp_path):
    write_jpegs(tmp_path / "pics", 50)
    as_image_dataset(tmp_path / "pics").to_parquet(str(tmp_path / "pics.parquet"))
    kw = dict(mode="RGB", image_size=[16, 16], num_proc=2, chunk=3)
    folder = module(tmp_path / "a", source="folder", root=str(tmp_path / "pics"), **kw)
    hub = module(tmp_path / "b", source="hub", hub=str(tmp_path / "pics.parquet"),
                 image_column="img", **kw)  # fmt: skip
    a, b = prepared(folder), prepared(hub)
    assert a.keys() == b.keys() and all(a[f] == b[f] for f in a if f != "meta.json")
    assert hub.meta["classes"] == ["c0", "c1", "c2", "c3"]  # a Parquet file keeps its ClassLabel


def test_a_datasets_own_test_split_stays_the_test_set(tmp_path):
    import datasets
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from src.utils.config import register_resolvers

    write_jpegs(tmp_path / "pics", 40)
    table = as_image_dataset(tmp_path / "pics")
    datasets.DatasetDict({"train": table.select(range(30)), "test": table.select(range(30, 40))}
                         ).save_to_disk(str(tmp_path / "saved"))  # fmt: skip
    register_resolvers()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["data=image_hub", f"data.hub={tmp_path / 'saved'}",
                                          "data.image_column=img",
                                          f"paths.data_dir={tmp_path / 'data'}"])  # fmt: skip
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup()
    assert dm.meta["images"]["test"] == 10 and sum(dm.meta["images"].values()) == 40
    assert dm.processed_dir.name == "saved-images"
    with pytest.raises(PipelineError, match=r"no column 'image'.*data\.image_column"):
        module(tmp_path / "c", source="hub", hub=str(tmp_path / "saved"))


def test_preparing_four_times_the_images_takes_no_more_memory(tmp_path):
    """Peak memory is set by data.chunk, not by the number of images: the images are decoded a
    chunk at a time and written to the memmaps as they come (numpy's arrays are traced)."""
    import tracemalloc

    peaks = []
    for n in (64, 256):
        write_jpegs(tmp_path / f"pics{n}", n, size=(48, 48))
        tracemalloc.start()
        ImageDataModule(str(tmp_path / f"out{n}"), source="folder", root=str(tmp_path / f"pics{n}"),
                        mode="RGB", num_proc=1, chunk=8).prepare_data()  # fmt: skip
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.3 * peaks[0], peaks  # holding every image: 4 x the images' 1.8 MB


def test_rows_are_read_from_the_file_without_a_memory_map_in_any_process(tmp_path):
    import pickle

    from src.data.arrays import Rows

    x = np.random.default_rng(0).integers(0, 256, (20, 3, 5, 4), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    rows = Rows(tmp_path / "x.npy", index=np.array([3, 7, 19]))
    assert len(rows) == 3 and np.array_equal(rows[1], x[7])
    copy = pickle.loads(pickle.dumps(rows))  # as a loader's worker gets it: a descriptor of its own
    assert copy.fd is None and np.array_equal(copy[2], x[19])


def test_training_crops_and_flips_and_eval_images_are_centre_cropped(tmp_path):
    write_jpegs(tmp_path / "pics", 40, size=(20, 24))
    dm = module(tmp_path, source="folder", root=str(tmp_path / "pics"), mode="RGB",
                crop=[16, 16], crop_scale=[0.3, 1.0], flip=True, shift=0)  # fmt: skip
    assert dm.model_kwargs["image_size"] == [16, 16]
    train, val = dm.splits["train"], dm.splits["val"]
    assert train[0][0].shape == val[0][0].shape == (3, 16, 16)
    assert not torch.equal(train[0][0], train[0][0])  # a new crop at every visit
    assert torch.equal(val[0][0], val[0][0])
    pixels = np.load(dm.processed_dir / "val_x.npy")[0, :, 2:18, 4:20].astype(np.float32)
    mean, std = np.array(dm.meta["mean"])[:, None, None], np.array(dm.meta["std"])[:, None, None]
    assert np.allclose(val[0][0].numpy(), (pixels - mean) / std, atol=1e-5)
    with pytest.raises(PipelineError, match=r"data.crop=\[32, 32\] is larger than the prepared"):
        module(tmp_path, source="folder", root=str(tmp_path / "pics"), crop=[32, 32])


def test_random_resized_crops_cover_the_scale_asked_for():
    from src.data.images import crop_box

    rng = np.random.default_rng(0)
    boxes = [crop_box(100, 80, (0.2, 0.5), (3 / 4, 4 / 3), rng) for _ in range(500)]
    shares = np.array([h * w / 8000 for _, _, h, w in boxes])
    assert shares.min() > 0.19 and shares.max() < 0.51 and shares.std() > 0.05
    assert all(t + h <= 100 and left + w <= 80 for t, left, h, w in boxes)


def test_trivial_augment_changes_training_batches_on_the_device_only_in_training(tmp_path):
    from types import SimpleNamespace

    dm = module(tmp_path, trivial_augment=True)
    batch = next(iter(dm.train_dataloader()))
    assert dm.on_after_batch_transfer(batch, 0) is batch  # no trainer: as it came
    dm.trainer = SimpleNamespace(training=False)
    assert dm.on_after_batch_transfer(batch, 0) is batch
    dm.trainer.training = True
    x, y = dm.on_after_batch_transfer(batch, 0)
    assert x.shape == batch[0].shape and y is batch[1] and not torch.equal(x, batch[0])
    low = (0 - dm.meta["mean"][0]) / dm.meta["std"][0]  # pixels stay within [0, 255]
    assert float(x.min()) >= low - 1e-4


def test_cutmix_pastes_a_box_of_another_image_and_lambda_is_the_share_kept():
    from src.models.image import ImageClassifier

    model = ImageClassifier(dict(arch="cnn"), dict(lr=1e-3), image_size=[16, 16], channels=1,
                            num_classes=3, cutmix=1.0)  # fmt: skip
    x = torch.arange(4.0)[:, None, None, None].expand(4, 1, 16, 16)  # image k: all k
    for _ in range(20):
        mixed, perm, lam = model.mixed(x)
        kept = (mixed == x).float().mean(dim=(1, 2, 3))  # the share of each image's own pixels
        moved = perm != torch.arange(4)
        assert torch.allclose(kept[moved], torch.full_like(kept[moved], lam))


def write_cifar10(folder, per_batch: int = 20) -> None:
    """A small CIFAR-10 in its own format: pickled dicts of uint8 rows (N, 3 * 32 * 32), channel
    planes in turn, with their labels, in five train batches and a test batch, and the names."""
    import pickle

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = [i % 10 for i in range(per_batch)]
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        data[:, :1024] = np.asarray(labels, np.uint8)[:, None] * 25  # red plane = 25 x label
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data}, f)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse",
             b"ship", b"truck"]  # fmt: skip
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names, b"num_vis": 3072}, f)


def test_cifar10_batches_are_read_as_colour_images_with_their_own_test_split(tmp_path):
    write_cifar10(tmp_path / "cifar" / "cifar-10-batches-py")
    dm = module(tmp_path, source="cifar10", root=str(tmp_path / "cifar"))
    meta = dm.meta
    assert meta["image_size"] == [32, 32] and meta["channels"] == 3
    assert meta["classes"][:2] == ["airplane", "automobile"]
    assert meta["images"]["test"] == 20 and meta["images"]["train"] + meta["images"]["val"] == 100
    x, y = dm.splits["test"][3]  # label 3: its red plane is 75 everywhere, before normalising
    red = x[0] * meta["std"][0] + meta["mean"][0]
    assert int(y) == 3 and torch.allclose(red, torch.full((32, 32), 75.0), atol=1e-3)


def test_a_cifar10_folder_without_its_batches_is_one_clear_error(tmp_path):
    (tmp_path / "cifar").mkdir()
    with pytest.raises(PipelineError, match=r"batches\.meta: not a CIFAR-10 file"):
        module(tmp_path, source="cifar10", root=str(tmp_path / "cifar"))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: (d / "a").mkdir(parents=True), "a: an empty class folder"),
        (lambda d: (write_png(d / "a" / "1.png"), write_png(d / "a" / "2.png", (5, 7))),
         "images of mixed sizes"),
        (lambda d: (write_png(d / "a" / "1.png"), (d / "a" / "bad.png").write_bytes(b"\x89PNG")),
         "bad.png: not a readable image"),
    ],
)  # fmt: skip
def test_bad_image_folders_are_one_clear_error_and_leave_nothing_behind(tmp_path, make, match):
    make(tmp_path / "pics")
    with pytest.raises(PipelineError, match=match):
        module(tmp_path, source="folder", root=str(tmp_path / "pics"))
    assert not (tmp_path / "processed").exists()


def test_kmeans_codes_round_trip_within_the_quantisation_error():
    from src.data.images import dequantize, fit_codebook, quantize

    x = read_digits().images[:300]  # (N, 1, 8, 8) uint8
    codebook = fit_codebook(x, 16, seed=0)
    assert codebook.shape == (16, 1) and np.all(np.diff(codebook[:, 0]) > 0)  # darkest first
    codes = quantize(x, codebook)
    assert codes.shape == (300, 64) and codes.max() < 16
    back = dequantize(torch.from_numpy(codes), torch.from_numpy(codebook), (8, 8))
    error = np.abs(back.numpy() - x / 255.0)
    gaps = np.diff(codebook[:, 0]).max()  # no pixel is further from its code than half a gap
    assert error.max() <= gaps / 2 + 1e-6 and error.mean() < 0.03


def test_the_benchs_context_model_predicts_a_pixel_from_its_causal_neighbours():
    """bench/vision.py's count baseline for ImageGPT: images of vertical stripes are certain
    given the pixel above (after the first row), noise costs log2 K bits whatever the context."""
    from bench.vision import context_bits

    rng = np.random.default_rng(0)
    stripes = np.broadcast_to(rng.integers(0, 4, (200, 1, 8)), (200, 8, 8)).copy()
    bits = context_bits(stripes[:100], stripes[100:], k=4)
    assert bits < 2 / 8 + 0.15  # ~2 bits for each first-row pixel, ~0 for the other 7 rows
    noise = rng.integers(0, 4, (2100, 8, 8))
    assert abs(context_bits(noise[:2000], noise[2000:], k=4) - 2) < 0.05


def test_the_patches_stage_writes_every_splits_codes_once_and_set_up_reads_them(
    tmp_path, monkeypatch
):
    from src.data import images

    dm = module(tmp_path, codes=8, patch=2, chunk=100)
    folder = dm.codes_dir
    assert folder.name == "processed-codes8-p2" and (folder / "codebook.npy").is_file()
    x = np.load(dm.processed_dir / "test_x.npy")
    codes = np.load(folder / "test_codes.npy")
    assert codes.dtype == np.uint16 and codes.shape == (len(x), 16)  # 8 x 8 -> 4 x 4 patches
    assert np.array_equal(codes, images.quantize(x, dm.codebook.numpy(), 2))
    monkeypatch.setattr(images, "quantize", None)  # neither done again nor at set-up
    monkeypatch.setattr(images, "fit_codebook", None)
    dm.prepare_data()
    dm.setup()
    monkeypatch.undo()
    resized = module(tmp_path, codes=8, patch=2, image_size=[4, 4])  # new images: new codes
    assert np.load(resized.codes_dir / "test_codes.npy").shape == (len(x), 4)


def test_imagegpt_batches_start_with_the_start_token_and_never_sample_it(tmp_path):
    dm = module(tmp_path, codes=8)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (128, 64) and bool((x[:, 0] == 8).all())
    assert torch.equal(x[:, 1:], y[:, :-1]) and int(y.max()) < 8
    assert dm.model_kwargs == {"image_size": [8, 8], "channels": 1, "vocab_size": 9}
    from src.models.gpt import ImageGPT

    gpt = ImageGPT(dict(n_layer=1, n_head=2, d_model=16), dict(lr=1e-3), vocab_size=9,
                   image_size=[8, 8], channels=1, codes=8,
                   generation=dict(strategy="sample", temperature=5.0))  # fmt: skip
    with torch.no_grad():
        gpt.net.lm_head.weight[8] = 10.0  # the start token would win every draw
    samples, completed = gpt.sample_images(y[:3], torch.Generator().manual_seed(0))
    assert samples.shape == completed.shape == (3, 64) and int(samples.max()) < 8
    assert torch.equal(completed[:, :32], y[:3, :32])  # the top half kept


# ---------------------------------------------------------------- through the entry point


def learn_digits(tmp_path, name: str, *overrides: str) -> None:
    """Train on the digits through the entry point into tmp_path/name and check what it wrote."""
    run = tmp_path / name
    assert_ok(run_module("src.train", "data=digits", *TINY, f"paths.data_dir={tmp_path / 'data'}",
                         *overrides, f"hydra.run.dir={run}"))  # fmt: skip
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/acc"] > metrics["test/acc_majority"] + 0.2
    assert {"test/f1", "train/loss", "val/acc", "train/images_per_sec"} <= metrics.keys()
    assert (run / "confusion.png").stat().st_size > 10_000
    assert (run / "attention.png").exists() == ("model=vit" in overrides)  # class token, rollout


def test_the_vit_learns_the_digits_through_the_entry_point(tmp_path):
    learn_digits(tmp_path, "vit", "model=vit")


def test_the_cnn_learns_the_digits_and_teaches_a_vit_that_keeps_no_copy_of_it(tmp_path):
    learn_digits(tmp_path, "cnn", "model=cnn")
    teacher = next((tmp_path / "cnn" / "checkpoints").glob("best-*.ckpt"))
    learn_digits(tmp_path, "student", "model=vit", f"model.teacher={teacher}")
    student = next((tmp_path / "student" / "checkpoints").glob("best-*.ckpt"))
    state = torch.load(student, weights_only=True)["state_dict"]
    assert not any(k.startswith("teacher") for k in state)
    teacher.unlink()  # the student loads without its teacher
    assert isinstance(load_classifier(student), ViT)
    with pytest.raises(PipelineError, match="classifies 8 x 8 images into 10 classes; this data "
                                            "has 28 x 28 and 10"):  # fmt: skip
        load_classifier(student, (28, 28), 10)


def test_imagegpt_learns_the_digits_and_draws_samples_through_the_entry_point(tmp_path):
    run = tmp_path / "run"
    proc = run_module("src.train", "model=imagegpt", "data=digits", "model.codes=8", *TINY,
                      "model.net.n_layer=2", "model.net.d_model=64", "model.optim.warmup_steps=5",
                      f"paths.data_dir={tmp_path / 'data'}", f"hydra.run.dir={run}")  # fmt: skip
    assert_ok(proc)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/bits_per_token"] < 2.5  # 3 bits: 8 codes drawn uniformly
    assert (run / "samples.png").stat().st_size > 10_000
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert len(ckpt["ImageDataModule"]["codebook"]) == 8


def test_a_missing_root_or_a_patch_that_does_not_fit_is_one_line(tmp_path):
    data = f"paths.data_dir={tmp_path / 'data'}"
    missing = run_module("src.train", "model=vit", "data=image_folder",
                         f"data.root={tmp_path / 'nowhere'}", data, *TINY)  # fmt: skip
    assert_one_error_line(missing, "nowhere: no such folder")
    misfit = run_module("src.train", "model=vit", "data=digits", "model.net.patch_size=3", data,
                        *TINY)  # fmt: skip
    assert_one_error_line(misfit, "do not tile the image's height of 8")
