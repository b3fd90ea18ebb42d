"""Training-time and cost estimates for image classifiers on each catalog GPU model (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from gpulease.core.catalog import Catalog, GpuModel
from gpulease.core.errors import InvalidInput
from gpulease.core.money import SECONDS_PER_HOUR, cost_for_seconds, ncu
from gpulease.core.numbers import parse_whole

# -- what the estimate counts ----------------------------------------------------------------
#
# The work of a training run is images × epochs forward+backward passes. A backward pass costs
# about twice a forward pass, so training FLOPs ≈ 3 × forward FLOPs; a multiply-accumulate
# (MAC) is 2 FLOPs. FLOPs grow with the pixel count: × (image_size / 224)².
#
# Time comes from measured throughput, not from FLOPs over peak: small and depthwise models run
# far below a GPU's peak (EfficientNet-B0 has a tenth of ResNet-50's FLOPs and trains at about
# the same images/s on an A100), so the estimate is
#   images/s(model, GPU, size) = ResNet-50 images/s(GPU) × relative(model) × (224 / size)²
# with the ResNet-50 figure per GPU from NVIDIA's published training results and the relative
# speed of each model from one benchmark that ran them all on the same GPU and software.
#
# These are tuned figures (mixed precision, large batches, a data pipeline that keeps up): a
# plain PyTorch loop with PIL decoding is often slower. Read the result as the compute a job
# needs, not as a whole session (setup, uploads, evaluation, idle time are not in it).

REFERENCE_SIZE = 224
TRAIN_PASSES = 3  # forward + backward ≈ 3 forward passes
FLOPS_PER_MAC = 2

MAX_IMAGES = 10**9
MAX_EPOCHS = 10**4
MIN_IMAGE_SIZE = 8
MAX_IMAGE_SIZE = 2048
MAX_GPUS = 64


@dataclass(frozen=True)
class ClassifierModel:
    """An image classifier: its forward cost and how fast it trains relative to ResNet-50."""

    name: str
    gmacs: float
    """Forward multiply-accumulates per 224×224 image, in billions (torchvision's "GFLOPS")."""
    params_millions: float
    relative_speed: float
    """Training images/s relative to ResNet-50 on the same GPU and software, at 224×224."""
    speed_source: str

    @property
    def train_gflops(self) -> float:
        """Training FLOPs per 224×224 image, in billions."""
        return self.gmacs * FLOPS_PER_MAC * TRAIN_PASSES


# Forward cost: torchvision's model documentation, "Table of all available classification
# weights", GFLOPS and Params columns (https://pytorch.org/vision/stable/models.html):
#   ResNet18 1.81 / 11.7M, ResNet50 4.09 / 25.6M, ResNet101 7.80 / 44.5M, ViT_B_16 17.56 /
#   86.6M, EfficientNet_B0 0.39 / 5.3M, MobileNet_V3_Large 0.22 / 5.5M, ConvNeXt_Tiny 4.46 /
#   28.6M. (torchvision counts a multiply-add once, so these are GMACs.)
#
# Relative speed: timm's training benchmark, every model on one RTX 3090 with PyTorch 1.12,
# CUDA 11.3, AMP, NCHW (huggingface/pytorch-image-models, results/
# benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv, train_samples_per_sec at 224×224):
#   resnet50 826.06, resnet18 2764.22, resnet101 568.98, vit_base_patch16_224 390.86,
#   efficientnet_b0 1459.11, mobilenetv3_large_100 2167.29, convnext_tiny 813.16.
# NVIDIA's own PyTorch EfficientNet-B0 on an A100 (2489 img/s) runs at 1.01× their ResNet-50
# (2470 img/s) rather than timm's 1.77×: small models depend on the implementation more than
# on the GPU, a spread worth knowing when reading the estimate.
_TIMM_RESNET50 = 826.06
_TIMM_SOURCE = "timm RTX 3090 AMP training benchmark (pt1.12)"

MODELS: tuple[ClassifierModel, ...] = (
    ClassifierModel("resnet18", 1.81, 11.7, 2764.22 / _TIMM_RESNET50, _TIMM_SOURCE),
    ClassifierModel("resnet50", 4.09, 25.6, 1.0, "reference model"),
    ClassifierModel("resnet101", 7.80, 44.5, 568.98 / _TIMM_RESNET50, _TIMM_SOURCE),
    ClassifierModel("vit_b_16", 17.56, 86.6, 390.86 / _TIMM_RESNET50, _TIMM_SOURCE),
    ClassifierModel("efficientnet_b0", 0.39, 5.3, 1459.11 / _TIMM_RESNET50, _TIMM_SOURCE),
    ClassifierModel("mobilenet_v3_large", 0.22, 5.5, 2167.29 / _TIMM_RESNET50, _TIMM_SOURCE),
    ClassifierModel("convnext_tiny", 4.46, 28.6, 813.16 / _TIMM_RESNET50, _TIMM_SOURCE),
    # A student's first model: four blocks of 3×3 conv + ReLU + 2×2 max-pool with 32, 64, 128
    # and 256 channels, global average pooling, a linear head. MACs counted by hand at 224×224:
    # 224²·9·3·32 + 112²·9·32·64 + 56²·9·64·128 + 28²·9·128·256 ≈ 0.737 G; 0.39M weights
    # before the head. No published training figure exists; we assume it uses the GPU as well
    # per FLOP as ResNet-50 (its wide early layers are memory-bound), so relative speed is the
    # FLOP ratio. Rough.
    ClassifierModel("small_cnn", 0.737, 0.4, 4.09 / 0.737, "rough: FLOP ratio to resnet50"),
)

REFERENCE_MODEL = "resnet50"


@dataclass(frozen=True)
class GpuThroughput:
    """ResNet-50 v1.5 training images/s on one GPU of a kind, mixed precision, 224×224."""

    prefix: str
    """Matched against catalog names with '-' and spaces removed, longest prefix first."""
    resnet50_images_per_s: float
    basis: str  # "published" or "derived"
    source: str


# Published (NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, "Training performance
# results", pytorch-21.03 NGC container, 1 GPU, mixed precision; https://github.com/NVIDIA/
# DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/resnet50v1.5/README.md):
#   DGX A100 (A100 80GB): 2470 img/s; DGX-1 (V100 16GB): 1200 img/s; DGX-1 (V100 32GB):
#   1156 img/s. 8-GPU strong scaling there: 6.72× on A100, 6.93× (16GB) / 6.96× (32GB) on V100.
# Peak dense FP16 tensor TFLOPS (NVIDIA datasheets) used to calibrate model-FLOPs utilisation:
_A100_PEAK_TFLOPS = 312.0
_V100_PEAK_TFLOPS = 125.0
_A100_RESNET50 = 2470.0
_V100_RESNET50 = 1156.0
_DLE_SOURCE = "NVIDIA DeepLearningExamples ResNet50 v1.5 PyTorch, 1 GPU AMP"


def _utilisation(images_per_s: float, peak_tflops: float) -> float:
    model = next(m for m in MODELS if m.name == REFERENCE_MODEL)
    return images_per_s * model.train_gflops * 1e9 / (peak_tflops * 1e12)


# Model-FLOPs utilisation of ResNet-50 training, the mean of the two published GPUs:
# A100 2470 × 24.54 GFLOP / 312 TFLOPS = 19.4%, V100 1156 × 24.54 / 125 = 22.7%: 21.1%.
# GPUs with no published figure get peak TFLOPS × this.
CALIBRATED_UTILISATION = (
    _utilisation(_A100_RESNET50, _A100_PEAK_TFLOPS)
    + _utilisation(_V100_RESNET50, _V100_PEAK_TFLOPS)
) / 2


def derived_resnet50_images_per_s(peak_tflops: float) -> float:
    """ResNet-50 training images/s of a GPU with this dense FP16 peak, at the calibrated MFU."""
    model = next(m for m in MODELS if m.name == REFERENCE_MODEL)
    return peak_tflops * 1e12 * CALIBRATED_UTILISATION / (model.train_gflops * 1e9)


GPU_THROUGHPUT: tuple[GpuThroughput, ...] = (
    GpuThroughput("A100", _A100_RESNET50, "published", f"{_DLE_SOURCE}, DGX A100 80GB"),
    GpuThroughput("V100", _V100_RESNET50, "published", f"{_DLE_SOURCE}, DGX-1 V100 32GB"),
    # No published T4 training figure was found. The same README publishes mixed-precision
    # ResNet-50 inference at batch 256 for both the T4 (1198 img/s) and the V100 16GB
    # (3382 img/s); we scale the V100 16GB training figure (1200 img/s) by that ratio:
    # 1200 × 1198 / 3382 ≈ 425 img/s. Peak × calibrated MFU would say ≈ 556 img/s (65 TFLOPS),
    # but the 70 W T4 cannot hold its boost clock under sustained load, which the measured
    # ratio includes and the datasheet peak does not.
    GpuThroughput("T4", 1200.0 * 1198 / 3382, "derived", "V100 training × T4/V100 inference"),
    # H100: Lambda's H100 analysis (https://lambdalabs.com/blog/nvidia-h100-gpu-deep-learning-
    # performance-analysis) puts vision models at ~2× an A100 SXM: 2 × 2470 = 4940 img/s.
    # Cross-check, MLPerf Training v3.0 (NVIDIA, https://developer.nvidia.com/deep-learning-
    # performance-training-inference/training): ResNet-50 v1.5 on 8× H100 SXM in 13.466 min
    # (MLPerf-ID 3.0-2053, MXNet); at the ~36 epochs such runs take (our assumption), that is
    # ≈ 7,100 img/s per GPU for MLPerf-tuned code, so 4940 is the cautious side. Peak × MFU
    # (989 TFLOPS) would say ≈ 8,500 img/s: convolutions do not scale with tensor peak.
    GpuThroughput("H100", 2 * _A100_RESNET50, "derived", "2× A100 (Lambda); MLPerf v3.0 check"),
    # H200: an H100's compute with more and faster memory; CNN training is compute-bound, so
    # we use the H100 figure.
    GpuThroughput("H200", 2 * _A100_RESNET50, "derived", "same compute as H100"),
    # No published figures found for these: peak dense FP16 tensor TFLOPS (NVIDIA datasheets:
    # P100 18.7, RTX 4090 165) × the calibrated MFU above.
    GpuThroughput("P100", derived_resnet50_images_per_s(18.7), "derived", "18.7 TFLOPS × MFU"),
    GpuThroughput("RTX4090", derived_resnet50_images_per_s(165.0), "derived", "165 TFLOPS × MFU"),
)

# CPU (no-GPU mode), rough: timm's CPU benchmark (results/benchmark-infer-fp32-nchw-pt240-cpu-
# i9_10940x-dynamo.csv, a 14-core i9-10940X, PyTorch 2.4, FP32) runs ResNet-50 inference at
# 67.2 img/s; training costs ~3 forward passes, so ~22 img/s. Other models scale by FLOPs,
# which suits CPUs better than GPUs. A server's CPU count varies; treat it as an order of
# magnitude.
CPU_RESNET50_IMAGES_PER_S = 67.2 / TRAIN_PASSES

# Data-parallel scaling on one node: 8 GPUs reach 6.72× (A100) to 6.96× (V100) of one in the
# README above, ~85%. We model efficiency(n) = 1 − 0.05·log2(n): 95% at 2, 90% at 4, 85% at
# 8, floored at 50%.
SCALING_LOSS_PER_DOUBLING = 0.05


def scaling_efficiency(gpus: int) -> float:
    if gpus <= 1:
        return 1.0
    return max(0.5, 1.0 - SCALING_LOSS_PER_DOUBLING * math.log2(gpus))


def get_model(name: str) -> ClassifierModel:
    for model in MODELS:
        if model.name == name.strip().lower():
            return model
    raise InvalidInput(f"unknown model {name!r}. {valid_inputs()}")


def valid_inputs() -> str:
    names = ", ".join(m.name for m in MODELS)
    return (
        f"An estimate takes model (one of {names}), images 1–{MAX_IMAGES:,}, "
        f"epochs 1–{MAX_EPOCHS:,}, image_size {MIN_IMAGE_SIZE}–{MAX_IMAGE_SIZE} pixels "
        f"and gpus 1–{MAX_GPUS}."
    )


@dataclass(frozen=True)
class EstimateRequest:
    model: ClassifierModel
    images: int
    epochs: int
    image_size: int
    gpus: int


def _whole(name: str, raw: str | int | None, low: int, high: int, default: int | None) -> int:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if default is None:
            raise InvalidInput(f"{name} is missing. {valid_inputs()}")
        return default
    return parse_whole(raw, name, low, high, hint=f". {valid_inputs()}")


def parse_request(
    model: str | None,
    images: str | int | None,
    epochs: str | int | None,
    image_size: str | int | None = None,
    gpus: str | int | None = None,
) -> EstimateRequest:
    """Check an estimate's inputs as people type them; every refusal lists what is valid."""
    if model is None or not model.strip():
        raise InvalidInput(f"model is missing. {valid_inputs()}")
    return EstimateRequest(
        model=get_model(model),
        images=_whole("images", images, 1, MAX_IMAGES, None),
        epochs=_whole("epochs", epochs, 1, MAX_EPOCHS, None),
        image_size=_whole("image_size", image_size, MIN_IMAGE_SIZE, MAX_IMAGE_SIZE, REFERENCE_SIZE),
        gpus=_whole("gpus", gpus, 1, MAX_GPUS, 1),
    )


def _normalised(name: str) -> str:
    return name.upper().replace("-", "").replace(" ", "").replace("_", "")


def gpu_throughput(gpu: GpuModel) -> GpuThroughput | None:
    """The ResNet-50 figure for a catalog GPU: the table's by name, else derived from the
    catalog's peak TFLOPS, else None (a GPU the operator listed with no peak)."""
    name = _normalised(gpu.name)
    matches = [t for t in GPU_THROUGHPUT if name.startswith(_normalised(t.prefix))]
    if matches:
        return max(matches, key=lambda t: len(t.prefix))
    if gpu.peak_tflops > 0:
        return GpuThroughput(
            gpu.name,
            derived_resnet50_images_per_s(gpu.peak_tflops),
            "derived",
            f"{gpu.peak_tflops:g} TFLOPS (pricing file) × MFU",
        )
    return None


@dataclass(frozen=True)
class EstimateRow:
    """One catalog model's figures. For the CPU row, 'GPU-hours' are instance-hours."""

    gpu_model: str
    is_gpu: bool
    devices: int
    images_per_second: float
    """Per device, for this model and image size."""
    basis: str  # published | derived | rough
    source: str
    device_seconds: int
    wall_seconds: int
    hourly_micro: int
    """The price of all `devices` for an hour."""
    cost_micro: int
    ncu: Decimal

    @property
    def gpu_hours(self) -> float:
        return self.device_seconds / SECONDS_PER_HOUR


@dataclass(frozen=True)
class Estimate:
    request: EstimateRequest
    train_gflops_per_image: float
    total_pflops: float
    scaling_efficiency: float
    rows: tuple[EstimateRow, ...]
    skipped: tuple[str, ...]
    """Catalog models with no throughput figure to estimate from."""


def _row(
    catalog: Catalog, gpu: GpuModel, req: EstimateRequest, size_factor: float
) -> EstimateRow | None:
    samples = req.images * req.epochs
    if gpu.is_gpu:
        found = gpu_throughput(gpu)
        if found is None:
            return None
        rate = found.resnet50_images_per_s * req.model.relative_speed / size_factor
        devices = req.gpus
        aggregate = rate * devices * scaling_efficiency(devices)
        basis, source = found.basis, found.source
        if req.model.speed_source.startswith("rough"):
            basis = "rough"
        elif req.model.name != REFERENCE_MODEL:
            # a published GPU figure is for ResNet-50; other models scale it by timm's ratio
            basis, source = (
                "derived",
                f"{source}; × {req.model.relative_speed:.2f} ({_TIMM_SOURCE})",
            )
    else:
        reference = get_model(REFERENCE_MODEL)
        rate = CPU_RESNET50_IMAGES_PER_S * reference.gmacs / req.model.gmacs / size_factor
        devices, aggregate = 1, rate
        basis, source = "rough", "timm CPU benchmark, 14-core i9-10940X"
    wall = max(1, math.ceil(samples / aggregate))
    hourly = gpu.hourly_micro * devices
    cost = cost_for_seconds(hourly, wall)
    return EstimateRow(
        gpu_model=gpu.name,
        is_gpu=gpu.is_gpu,
        devices=devices,
        images_per_second=rate,
        basis=basis,
        source=source,
        device_seconds=wall * devices,
        wall_seconds=wall,
        hourly_micro=hourly,
        cost_micro=cost,
        ncu=ncu(cost, catalog.ncu_reference_hourly_micro),
    )


def estimate(catalog: Catalog, req: EstimateRequest) -> Estimate:
    """Expected GPU-hours, wall time, cost and NCU of a training run on every catalog model.

    Cost is what the meter would charge for holding `gpus` GPUs for the wall time, at the
    catalog's hourly price; NCU expresses that cost in A100-days at the catalog price.
    """
    size_factor = (req.image_size / REFERENCE_SIZE) ** 2
    rows, skipped = [], []
    for gpu in catalog.models:
        row = _row(catalog, gpu, req, size_factor)
        if row is None:
            skipped.append(gpu.name)
        else:
            rows.append(row)
    per_image = req.model.train_gflops * size_factor
    return Estimate(
        request=req,
        train_gflops_per_image=per_image,
        total_pflops=per_image * req.images * req.epochs / 1e6,
        scaling_efficiency=scaling_efficiency(req.gpus),
        rows=tuple(rows),
        skipped=tuple(skipped),
    )
