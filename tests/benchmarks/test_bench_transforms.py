"""bench/transforms.py runs end to end on a few generated JPEGs, one process, one round: every
variant the bench names (stock, nanopatch, fast decode, torchvision's tensor path stock and under
nanopatch, TorchCodec's decode on that path, Kornia, albumentations where installed) has a row per
pipeline, each says what it really ran, and the pixel checks hold: nanopatch's tensors equal
stock's within one grey level, and the tensor path under nanopatch equals the tensor path; the
peers' pixels are stated."""

from __future__ import annotations

import json
import os

from conftest import REPO_ROOT, run_python

PIPELINES = ("train", "val", "train+jitter")


def test_tiny_run_of_every_variant_with_the_tensor_path(tmp_path):
    script = str(REPO_ROOT / "bench" / "transforms.py")
    args = ["--processes", "1", "--rounds", "1", "--small", "2", "--large", "0", "--sample-time", "0.01"]
    proc = run_python([script, *args, "--data", str(tmp_path / "data"), "--json"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    variants = ["stock", "nanopatch", "nanopatch fast decode", "tv tensors", "tv tensors, nanopatch"]
    if report["machine"]["albumentations"]:  # installed where the bench ran
        variants.insert(3, "albumentations")
    # tox's py env installs TorchCodec and Kornia (tox.ini): there their columns must be there
    peers_required = os.environ.get("NANOPATCH_TEST_REQUIRE_FRAMEWORKS") == "1"
    for peer in ("torchcodec", "kornia"):
        assert report["machine"][peer] or not peers_required, report["notes"]
        if report["machine"][peer]:
            variants.append(peer)
    assert list(report["implementations"]) == variants
    tensor = report["implementations"]["tv tensors"]
    assert tensor["state"] == "nothing patched" and tensor["uses"] == "transforms.v2 on uint8 tensors"
    assert "torchvision.transforms.v2" in " ".join(tensor["transform_classes"])
    assert report["implementations"]["tv tensors, nanopatch"]["state"].startswith("nanopatch.patch_torch(")
    assert report["implementations"]["stock"]["uses"] == "torchvision"
    rows = {(r["pipeline"], r["variant"]): r for r in report["rows"]}
    assert set(rows) == {(p, v) for p in PIPELINES for v in variants}
    assert all(r["rate"] > 0 and r["size"] == "500x375" for r in rows.values())
    for pipeline in PIPELINES:
        (check,) = report["checks"][f"{pipeline}|500x375"]
        assert check["images"] == 2 and check["nanopatch_max_abs_diff"] <= check["tolerance"]
        assert check["tensor_path_nanopatch_max_abs_diff"] <= check["tolerance"]
        # v2 on tensors resizes with its own kernel: close to PIL's, not equal; stated, not hidden
        assert 0 <= check["tensor_path_mean_grey_levels"] < 2 and check["tensor_path_max_grey_levels"] >= 0
        if "torchcodec" in variants:  # the same v2 pipeline and draws on TorchCodec's decode
            assert 0 <= check["torchcodec_mean_grey_levels"] < 2
        if "kornia" in variants:  # its own crops: its pixels compared on val alone
            assert ("kornia_mean_grey_levels" in check) == (pipeline == "val")
    for pipeline in PIPELINES:  # the tensor path under nanopatch against its own stock, and only there
        for variant in variants:
            ratio = rows[(pipeline, variant)]["x_tensor_path_stock"]
            assert (ratio is not None) == (variant == "tv tensors, nanopatch")
            if ratio is not None:
                tensor = rows[(pipeline, "tv tensors")]["rate"]
                assert abs(ratio - rows[(pipeline, variant)]["rate"] / tensor) < 1e-9
    if "torchcodec" in variants:
        codec = report["implementations"]["torchcodec"]
        assert codec["state"] == "nothing patched" and "torchcodec.decoders.decode_image" in codec["reads"]
    if "kornia" in variants:
        kornia = report["implementations"]["kornia"]
        assert "kornia.augmentation" in " ".join(kornia["transform_classes"])
