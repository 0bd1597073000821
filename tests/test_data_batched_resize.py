"""The tensor path: one bytes tensor per batch, one batched Pillow-exact resize, the batch made
ready in a thread and on a stream of its own (CUDA simulated on the CPU by ``fakecuda``)."""

import io
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from fakecuda import FakeCuda
from PIL import Image
from torchvision.transforms import functional as F

import imagenet_cog
from imagenet_cog import FeatureExtractor
from imagenet_cog._data import network_inputs, tensor_decode
from imagenet_cog._data.batched_resize import ResizePlan, resize_crop_batch, resized_size
from imagenet_cog._data.device_feed import DeviceFeed
from imagenet_cog._data.tensor_decode import EncodedImages, collate_encoded
from imagenet_cog._data.worker_images import WorkerImages, WorkerSteps
from imagenet_cog.datasets import ImageDataset

PHOTOS = [
    str(Path(imagenet_cog.__file__).parent / "data" / "photos" / name)
    for name in ("china.jpg", "flower.jpg", "grace_hopper.jpg")
]


def _pillow(pixels, resize, crop, interpolation):
    """torchvision's Resize then CenterCrop of a PIL image, as uint8 HWC."""
    image = Image.fromarray(pixels)
    h, w = resized_size(pixels.shape[:2], resize)
    image = image.resize((w, h), Image.Resampling[interpolation.upper()])
    return np.asarray(F.center_crop(image, [crop]))


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear", "nearest"])
def test_the_batched_resize_gives_pillows_pixels(interpolation):
    rng = np.random.default_rng(0)
    photo = np.asarray(Image.open(PHOTOS[2]).convert("RGB"))
    # Shrunk and enlarged, landscape and portrait, tall enough for Pillow 13 to run the
    # vertical pass first, 1 pixel wide, and crops larger than the resize (padding).
    sizes = [(375, 320), (320, 375), (28, 28), (300, 40), (900, 60), (1, 5), (7, 1), (64, 64)]
    sizes += [tuple(int(v) for v in rng.integers(1, 500, 2)) for _ in range(24)]
    images = []
    for h, w in sizes:
        noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # its overshoots are clipped
        images.append(noise if h > 375 or w > 320 or rng.random() < 0.5 else photo[:h, :w].copy())
    tensors = [torch.from_numpy(a).permute(2, 0, 1) for a in images]
    for resize, crop in [(64, 64), (72, 64), (48, 60), ([40, 90], 56)]:
        plans = [ResizePlan(a.shape[:2], resize, crop, interpolation) for a in images]
        ours = resize_crop_batch(tensors, plans, torch.device("cpu"))
        assert ours.dtype == torch.uint8 and tuple(ours.shape) == (len(images), 3, crop, crop)
        for k, pixels in enumerate(images):
            theirs = _pillow(pixels, resize, crop, interpolation)
            np.testing.assert_array_equal(ours[k].permute(1, 2, 0).numpy(), theirs, (k, resize))


def _write_jpegs(folder, n, seed):
    """``n`` JPEGs cut from the shipped photos at varied sizes: half progressive, some
    grayscale; their paths and whether each is progressive."""
    rng = np.random.default_rng(seed)
    photos = [Image.open(p).convert("RGB") for p in PHOTOS]
    paths, progressive = [], []
    for i in range(n):
        photo = photos[i % len(photos)]
        w, h = int(rng.integers(12, 200)), int(rng.integers(12, 200))
        x0, y0 = int(rng.integers(0, photo.width - 100)), int(rng.integers(0, photo.height - 100))
        image = photo.crop((x0, y0, x0 + 100, y0 + 100)).resize((w, h), Image.Resampling.BILINEAR)
        if rng.random() < 0.1:
            image = image.convert("L")
        progressive.append(bool(rng.random() < 0.5))
        paths.append(str(folder / f"{i:04d}.JPEG"))
        image.save(paths[-1], quality=int(rng.integers(60, 96)), progressive=progressive[-1])
    return paths, progressive


@pytest.mark.slow
def test_the_tensor_path_gives_pillows_pixels_on_1000_images(tmp_path, monkeypatch):
    paths, progressive = _write_jpegs(tmp_path, 1000, 0)
    calls = []
    real = tensor_decode._decode

    def counted(datas, device):
        calls.append(len(datas))
        return real(datas, device)

    monkeypatch.setattr(tensor_decode, "_decode", counted)
    pixels = {"size": 56, "mean": None, "std": None}
    common = {"preprocessing": {**pixels, "resize": 64}, "normalize": False, "batch_size": 100}
    common["layer"] = "output"  # the network's input, as the features
    exact = FeatureExtractor(torch.nn.Identity(), decoder="pil", resize="pil", **common)
    tensor = FeatureExtractor(torch.nn.Identity(), decoder="torchvision", **common)
    expected, got = exact.transform(paths), tensor.transform(paths)
    assert expected.shape == (1000, 3 * 56 * 56)
    np.testing.assert_array_equal(got, expected)  # 0 levels apart, every image
    # One decode call per batch of ten, for the batch's baseline JPEGs; the progressive ones
    # were decoded in the workers.
    assert len(calls) == 10 and sum(calls) == progressive.count(False)
    assert tensor.pillow_fallbacks_ == [] and tensor.decoder_check_["max_abs_diff"] == 0


def test_a_batch_travels_as_one_bytes_tensor_with_offsets(tmp_path):
    paths, progressive = _write_jpegs(tmp_path, 8, 1)
    buf = io.BytesIO()
    Image.new("RGB", (20, 10)).save(buf, "PNG")
    (tmp_path / "png.JPEG").write_bytes(buf.getvalue())
    paths.append(str(tmp_path / "png.JPEG"))
    p = {"resize": 32, "crop": 32, "interpolation": "bicubic"}
    steps = WorkerSteps(p, "pil", True)
    source = EncodedImages(WorkerImages(ImageDataset(paths).with_transform(steps.from_pil), steps))
    batch = collate_encoded([source[i] for i in range(len(paths))])
    baseline = [i for i, prog in enumerate(progressive) if not prog]
    assert batch["jpeg"] == baseline
    assert batch["data"].dtype == torch.uint8 and batch["data"].ndim == 1
    offsets = batch["offsets"].tolist()
    for k, i in enumerate(baseline):  # each JPEG's bytes, end to end, and its size
        data = batch["data"][offsets[k] : offsets[k + 1]].numpy().tobytes()
        assert data == Path(paths[i]).read_bytes()
        with Image.open(paths[i]) as image:
            assert tuple(batch["sizes"][k]) == (image.height, image.width)
    # The progressive JPEGs and the PNG come decoded, resized and cropped: uint8 pixels.
    assert batch["decoded"] == [i for i, prog in enumerate(progressive) if prog] + [8]
    assert batch["pixels"].dtype == torch.uint8 and batch["pixels"].shape[1:] == (3, 32, 32)
    assert batch["fallbacks"] == [(8, "not a JPEG file")]


class _FakeCuda(FakeCuda):
    """The simulation, with the CPU device taken as CUDA device 0."""

    def _index(self, device):
        if device is None or isinstance(device, int):
            return super()._index(device)
        device = torch.device(device)
        return device.index if device.type == "cuda" and device.index is not None else 0


class _OnCuda(DeviceFeed):
    """The feed as it runs on CUDA: in a thread, on a side stream."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "background": True, "streams": True})


def test_the_next_batch_is_made_ready_on_a_side_stream_while_the_network_runs(
    tmp_path, monkeypatch
):
    paths, _ = _write_jpegs(tmp_path, 40, 2)
    kwargs = {"preprocessing": {"size": 32}, "batch_size": 8, "decoder": "torchvision"}
    expected = FeatureExtractor("torchvision:resnet18:none", **kwargs).transform(paths)

    log, prepared = [], []
    real_call = tensor_decode.TensorDecoder.__call__

    def prepare(self, batch):
        stream = torch.cuda.current_stream()
        out = real_call(self, batch)
        prepared.append((threading.current_thread().name, stream, int(out[0][0])))
        return out

    real_forward = FeatureExtractor._forward

    def forward(self, x):
        # The consumer's stream has waited for every batch made ready so far.
        log.append(("forward", len(torch.cuda.current_stream().waited)))
        return real_forward(self, x)

    real_embed = FeatureExtractor._embed

    def embed(self, x):
        result = real_embed(self, x)
        n = sum(1 for what, _ in log if what == "forward")

        def waited():
            log.append(("wait", n))
            return result()

        return waited

    cuda = _FakeCuda(n_devices=1)
    with cuda.install(monkeypatch):
        monkeypatch.setattr(tensor_decode.TensorDecoder, "__call__", prepare)
        monkeypatch.setattr(FeatureExtractor, "_forward", forward)
        monkeypatch.setattr(FeatureExtractor, "_embed", embed)
        monkeypatch.setattr(FeatureExtractor, "_launch_ahead", staticmethod(lambda device: True))
        monkeypatch.setattr(network_inputs, "DeviceFeed", _OnCuda)
        got = FeatureExtractor("torchvision:resnet18:none", **kwargs).transform(paths)
    np.testing.assert_array_equal(got, expected)
    # Every batch was made ready in the feed's thread, on a stream that is not the default.
    assert len(prepared) == 5
    assert all(name == "imagenet_cog-feed" and not s.default for name, s, _ in prepared), [
        (name, s.default) for name, s, _ in prepared
    ]
    side = {id(s) for _, s, _ in prepared}
    recorded = [e for e in cuda.events if id(e.stream) in side]
    assert len(recorded) == 5
    # The network's stream waited for each batch's event before the batch's forward pass,
    # with no host wait; and the features of batch n were waited for after batch n + 1
    # went to the network.
    assert cuda.defaults[0].waited == recorded
    assert [n for what, n in log if what == "forward"] == [1, 2, 3, 4, 5]
    assert all(e.host_waits == 0 for e in recorded)
    order = [(what, n) for what, n in log]
    waits = [i for i, (what, _) in enumerate(order) if what == "wait"]
    forwards = [i for i, (what, _) in enumerate(order) if what == "forward"]
    assert all(w > f for w, f in zip(waits[:-1], forwards[1:]))


def test_a_failure_in_the_feed_is_raised_where_the_batches_are_used():
    def broken(batch):
        if batch == 2:
            raise OSError("disk gone")
        return batch, None

    seen = []

    def consume():
        for out, _ in DeviceFeed([1, 2, 3], broken, torch.device("cpu"), background=True):
            seen.append(out)

    with pytest.raises(OSError, match="disk gone"):
        consume()
    assert seen == [1]
    # Stopped early: the thread ends too.
    feed = iter(DeviceFeed(range(100), lambda b: (b, None), torch.device("cpu"), background=True))
    assert next(feed) == (0, None)
    feed.close()
    assert not any(t.name == "imagenet_cog-feed" for t in threading.enumerate())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_batched_resize_on_cuda_gives_pillows_pixels():
    rng = np.random.default_rng(3)
    images = [
        rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
        for h, w in rng.integers(8, 700, (64, 2))
    ]
    tensors = [torch.from_numpy(a).permute(2, 0, 1).cuda() for a in images]
    plans = [ResizePlan(a.shape[:2], 224, 224, "bicubic") for a in images]
    ours = resize_crop_batch(tensors, plans, torch.device("cuda")).cpu()
    for k, pixels in enumerate(images):
        np.testing.assert_array_equal(
            ours[k].permute(1, 2, 0).numpy(), _pillow(pixels, 224, 224, "bicubic")
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_worker_path_gives_the_cpu_paths_features(tmp_path):
    paths, _ = _write_jpegs(tmp_path, 64, 4)
    kwargs = {"preprocessing": {"size": 64}, "batch_size": 16, "resize": "torch"}
    cpu = FeatureExtractor("torchvision:resnet18:none", device="cpu", **kwargs)
    cuda = FeatureExtractor("torchvision:resnet18:none", device="cuda", num_workers=2, **kwargs)
    assert cuda.fingerprint() == cpu.fingerprint()  # "auto" on CUDA: the worker path
    np.testing.assert_allclose(cuda.transform(paths), cpu.transform(paths), atol=1e-3)
    # The features came back through pinned memory, one batch behind the network.
    assert FeatureExtractor._launch_ahead(torch.device("cuda"))
