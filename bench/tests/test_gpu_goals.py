"""bench/gpu_goals.py: the GPU goals judged on made-up numbers, and read back from an OUT folder."""
import json

from bench import gpu_goals


def _out(tmp_path, tf32=1000.0, fp16=2400.0, loop_device=2100.0, images=2048, small=45.0, loader=2500.0,
         y5_seconds=130.0, identical=True):
    (tmp_path / "steps.json").write_text(json.dumps([
        {"candidate": "tf32", "img/s": tf32}, {"candidate": "fp16-foreach", "img/s": fp16 * 0.9},
        {"candidate": "fp16", "img/s": fp16, "peak GiB": 10.0}, {"candidate": "fp16-graphs", "error": "failed: X"}]))
    (tmp_path / "compile.json").write_text(json.dumps([{"candidate": "fp16-compile", "img/s": fp16 * 1.2,
                                                        "compile s": 70.0}]))
    for path, workers, rate in (("device", 8, loop_device), ("host", 8, 500.0), ("device", 16, 2200.0),
                                ("host", 16, 900.0)):
        (tmp_path / f"loop_{path}_w{workers}.json").write_text(json.dumps(
            {"it/s": rate / 64, "img/s": rate, "images_per_epoch": images}))
    (tmp_path / "loop_nondet.json").write_text(json.dumps({"it/s": 40.0, "img/s": 2560.0}))
    (tmp_path / "loop_small.json").write_text(json.dumps({"it/s": small, "img/s": small * 16}))
    (tmp_path / "loader.log").write_text(
        "\n imgsz  cache  workers  augment  images/s  device s/batch (0)\n"
        f"   640    ram       16     host     819.0  -\n   640    ram       16   device    {loader:.1f}  0.0123\n")
    (tmp_path / "decode.json").write_text(json.dumps({"cv2 img/s (1 core)": 90.0, "decode_jpeg img/s (cuda)": 3000.0,
                                                      "device": "cuda:0"}))
    (tmp_path / "same_run.json").write_text(json.dumps({"identical_weights": identical, "identical_results": identical,
                                                        "max_weight_diff": 0.0 if identical else 1.0}))
    for name, m, s in (("ours", 0.70, 60.0), ("yolov5", 0.30, y5_seconds)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "results.csv").write_text(f"epoch,  metrics/mAP_0.5:0.95\n0, 0.1\n9, {m}\n")
        (tmp_path / f"{name}.seconds").write_text(str(s))
    return tmp_path


def _rows(out):
    return {g: (m, ok) for g, m, _, ok in gpu_goals.goals(gpu_goals.read_out(out))}


def test_every_goal_met_on_numbers_that_meet_them(tmp_path):
    rows = _rows(_out(tmp_path))
    judged = {g: ok for g, (_, ok) in rows.items() if ok is not None}
    assert all(judged.values()) and len(judged) == 9, judged
    assert rows["3 loader: --augment-on device, 16 workers"][0] == "2500 img/s; the device's share 12.3 ms a batch"
    assert rows["1 step: best fp16 candidate over TF32"][0] == "2.88x (fp16-compile)"
    assert rows["1 step candidate: fp16-graphs"][0] == "failed: X"
    assert "0.88 of the fp16 step" in rows["2 loop: --augment-on device, 8 workers"][0]
    assert rows["2 loop: --augment-on host, 8 workers"][1] is None  # information: the goal is the device path's


def test_each_missed_goal_is_reported(tmp_path):
    rows = _rows(_out(tmp_path, fp16=1500.0, loop_device=1000.0, small=15.0, loader=800.0, y5_seconds=72.0,
                      identical=False))
    missed = {g for g, (_, ok) in rows.items() if ok is False}
    assert missed == {"1 step: fp16 (train.py's) over TF32", "1 step: fp16 images/s",
                      "1 step: best fp16 candidate over TF32",
                      "2 loop: --augment-on device, 8 workers", "2 loop: yolov5n 192 batch 16, built-in set",
                      "3 loader: --augment-on device, 16 workers", "5 peers: YOLOv5's time over ours",
                      "seeded run twice (deterministic, CUDA default)"}


def test_the_loop_goal_needs_2048_images(tmp_path):
    rows = _rows(_out(tmp_path, images=128))  # COCO128 alone: the loop would time epoch start-ups
    assert rows["2 loop: --augment-on device, 8 workers"][1] is False


def test_missing_figures_are_marked_not_crashing(tmp_path):
    rows = gpu_goals.goals(gpu_goals.read_out(tmp_path))
    assert all(ok is None for *_, ok in rows) and "missing" in gpu_goals.table(rows)
