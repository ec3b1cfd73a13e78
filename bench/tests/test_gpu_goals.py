"""bench/gpu_goals.py: the GPU-throughput goals judged on made-up numbers, and read back from an OUT folder."""
import json

from bench import gpu_goals


def _out(tmp_path, fp16_rate=2400.0, loop_rate=2100.0, small=45.0, loader=2500.0, y5_seconds=130.0):
    (tmp_path / "amp.json").write_text(json.dumps([
        {"mode": "off", "img/s": 1000.0, "peak GiB": 20.0}, {"mode": "fp16", "img/s": fp16_rate, "peak GiB": 10.0},
        {"mode": "bf16", "img/s": 2000.0, "peak GiB": 10.0}]))
    (tmp_path / "loop_coco.json").write_text(json.dumps({"it/s": loop_rate / 64, "img/s": loop_rate}))
    (tmp_path / "loop_small.json").write_text(json.dumps({"it/s": small, "img/s": small * 16}))
    (tmp_path / "loader.log").write_text(f"\n imgsz  cache  workers  images/s\n   640    ram       16    {loader:.1f}\n")
    (tmp_path / "same_run.json").write_text(json.dumps({"identical_weights": True, "max_weight_diff": 0.0,
                                                        "identical_results": True}))
    (tmp_path / "autobatch.log").write_text("AutoBatch: 130.00 GiB free ... batch size 96 (capped at 96: a quarter)\n")
    for name, m, s in (("ours", 0.70, 60.0), ("yolov5", 0.30, y5_seconds)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "results.csv").write_text(
            f"epoch,  metrics/mAP_0.5:0.95\n0, 0.1\n9, {m}\n")
        (tmp_path / f"{name}.seconds").write_text(str(s))
    return tmp_path


def test_every_goal_met_on_numbers_that_meet_them(tmp_path):
    rows = gpu_goals.goals(gpu_goals.read_out(_out(tmp_path)))
    judged = [ok for *_, ok in rows if ok is not None]
    assert len(judged) == 9 and all(judged)
    assert any("capped at 96" in m for _, m, _, _ in rows)


def test_each_missed_goal_is_reported(tmp_path):
    rows = gpu_goals.goals(gpu_goals.read_out(_out(tmp_path, fp16_rate=1500.0, loop_rate=1000.0, small=15.0,
                                                   loader=800.0, y5_seconds=72.0)))
    missed = {g for g, _, _, ok in rows if ok is False}
    assert missed == {"1 step: fp16 over FP32", "1 step: fp16 images/s", "2 loop: COCO128 640 over the step",
                      "2 loop: yolov5n 192 batch 16", "3 loader: 640 mosaic, 16 workers",
                      "5 peers: YOLOv5's time over ours"}


def test_missing_figures_are_marked_not_crashing(tmp_path):
    rows = gpu_goals.goals(gpu_goals.read_out(tmp_path))
    assert all(ok is None for *_, ok in rows) and "missing" in gpu_goals.table(rows)
