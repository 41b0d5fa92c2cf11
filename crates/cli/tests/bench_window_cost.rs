//! `strata bench --spec-window-cost K` on a small synthetic MoE file (CPU backend): the
//! JSON object's counts follow from -n and K (every window accepted its K drafts, or the
//! command fails), its figures are consistent with each other, with graphs, without, and
//! with offloaded experts; too few tokens for a window is an error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("run strata")
}

/// The file in a folder of its own per test (`name`), which the test removes.
fn synth_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tiny-qwen3moe.gguf");
    let path = file.to_str().unwrap();
    let out = strata(&[
        "synth",
        "--arch",
        "qwen3moe",
        "--layers",
        "2",
        "--hidden",
        "128",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--experts",
        "8",
        "--experts-used",
        "2",
        "--expert-ffn",
        "128",
        "--quant",
        "Q8_0",
        "-o",
        path,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    file
}

/// The JSON objects `strata bench ... --json` prints, one a line.
fn bench(file: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["bench", "-m", file.to_str().unwrap(), "--backend", "cpu"];
    args.extend_from_slice(extra);
    args.push("--json");
    let out = strata(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "strata {args:?} failed: {stderr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn window_cost_reports_consistent_figures() {
    let file = synth_file("window-cost");
    let n = 18;
    for (k, extra) in [
        (1, vec![]),
        (4, vec![]),
        (4, vec!["--no-graphs"]),
        (5, vec!["--expert-cache", "8"]),
    ] {
        let ks = k.to_string();
        let mut args = vec!["-p", "7", "-n", "18", "-r", "2", "--spec-window-cost", &ks];
        args.extend_from_slice(&extra);
        let all = bench(&file, &args);
        assert_eq!(all.len(), 1);
        let v = &all[0];
        let what = format!("K {k} {extra:?}: {v}");
        // Two repetitions pooled.
        assert_eq!(v["plain_steps"], 2 * (n - 1), "{what}");
        assert_eq!(v["windows"], 2 * ((n - 1) / (k + 1)), "{what}");
        assert_eq!(v["window_positions"], k + 1, "{what}");
        assert_eq!(v["graphs"], !extra.contains(&"--no-graphs"), "{what}");
        let (step, window) = (f(v, "step_ms"), f(v, "window_ms"));
        assert!(step > 0.0 && window > 0.0, "{what}");
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs());
        assert!(close(f(v, "window_step_ratio"), window / step), "{what}");
        assert!(close(f(v, "plain_tokens_per_s"), 1e3 / step), "{what}");
        let per_window = (k + 1) as f64 * 1e3 / window;
        assert!(close(f(v, "window_tokens_per_s"), per_window), "{what}");
        let cached = extra.contains(&"--expert-cache");
        assert_eq!(v["expert_cache"], cached, "{what}");
        for key in ["plain_expert_hit_rate", "window_expert_hit_rate"] {
            match v[key].as_f64() {
                Some(r) => assert!(cached && (0.0..=1.0).contains(&r), "{what}"),
                None => assert!(!cached, "{what}"),
            }
        }
    }
    // Several sizes: one plain run (the same step figures), an object per size in order.
    let all = bench(
        &file,
        &["-p", "7", "-n", "18", "--spec-window-cost", "3,1,8"],
    );
    let ks: Vec<u64> = all
        .iter()
        .map(|v| v["spec_window_k"].as_u64().unwrap())
        .collect();
    assert_eq!(ks, [3, 1, 8]);
    for v in &all {
        let k = v["spec_window_k"].as_u64().unwrap();
        assert_eq!(v["windows"].as_u64(), Some((n as u64 - 1) / (k + 1)), "{v}");
        assert_eq!(v["step_ms"], all[0]["step_ms"], "{v}");
        let ratio = f(v, "window_ms") / f(v, "step_ms");
        assert!(
            (f(v, "window_step_ratio") - ratio).abs() <= 1e-6 * ratio,
            "{v}"
        );
    }
    // -n 5 holds no window of 5 positions and its bonus token.
    let out = strata(&[
        "bench",
        "-m",
        file.to_str().unwrap(),
        "--backend",
        "cpu",
        "-n",
        "5",
        "--spec-window-cost",
        "4",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("hold no window"), "{stderr}");
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[test]
fn window_cost_profiles_steps_and_windows_per_kernel() {
    // STRATA_KERNEL_TIMING=1 (the CPU backend times its kernels too): the last repetition's
    // plain steps and windows, each over its own count, not the repetitions' pooled ones.
    let file = synth_file("window-profile");
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["bench", "-m", file.to_str().unwrap(), "--backend", "cpu"])
        .args(["-p", "7", "-n", "18", "-r", "2", "--spec-window-cost", "4"])
        .env("STRATA_KERNEL_TIMING", "1")
        .output()
        .expect("run strata");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for (head, count) in [
        ("plain step profile:", "(17 steps)"),
        ("window of 5 profile:", "(3 windows)"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(head))
            .unwrap_or_else(|| panic!("no `{head}` in {stderr}"));
        assert!(line.ends_with(count), "{line}");
    }
    // Each profile lists the projections every step and window launches.
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("mul_mat ")).count(),
        2,
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}
