//! `bench --quick` runs on this build's binaries and every scenario (issues 13 and 32)
//! produces numbers. Whether targets are met is not checked: timings on a loaded CI machine must
//! not fail tests; `docs/performance.md` holds a full run on release binaries.

use std::process::Command;

use battery_e2e::apiserver::target_binary;
use serde_json::Value;

#[test]
fn quick_bench_measures_every_scenario() {
    // The apiserver and the agent as the other e2e tests find them (built when missing);
    // bench is this package's own binary.
    let binary = target_binary("battery-apiserver", "battery-apiserver");
    target_binary("battery-agent", "battery-agent");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let output = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--quick")
        .arg("--binary")
        .arg(&binary)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().expect("rows");
    for scenario in battery_bench::scenarios() {
        let numbers: Vec<f64> = rows
            .iter()
            .filter(|row| row["scenario"] == *scenario)
            .filter_map(|row| row["value"].as_f64())
            .collect();
        assert!(!numbers.is_empty(), "{scenario}: no figures in {report}");
        for value in numbers {
            assert!(
                value.is_finite() && value >= 0.0,
                "{scenario}: {value} in {report}"
            );
        }
        assert!(
            stdout.contains(&format!("| {scenario} |")),
            "{scenario} is not in the table:\n{stdout}"
        );
    }
    for key in ["cores", "memoryMb"] {
        assert!(report["machine"][key].as_u64() > Some(0), "{key}: {report}");
    }
    assert!(
        report["build"].as_str().unwrap().starts_with("debug"),
        "{report}"
    );
}
