//! Every shipped scenario parses and plans; every bad fixture fails with its expected message
//! (which names the line).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use midway_lab::{build_plan, LoadedScenario, PlanOptions};
use midway_testkit::host::repo_root;

fn files_in(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

#[test]
fn every_shipped_scenario_parses_and_plans() {
    let files: Vec<_> = files_in(&repo_root().join("scenarios"), "toml")
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".claims.toml"))
        .collect();
    assert!(!files.is_empty(), "no scenario files found");
    for file in &files {
        let loaded = LoadedScenario::load(file).unwrap_or_else(|e| panic!("{e}"));
        let full = build_plan(&loaded, &PlanOptions::default()).unwrap();
        let quick = build_plan(
            &loaded,
            &PlanOptions {
                quick: true,
                ..PlanOptions::default()
            },
        )
        .unwrap();
        assert!(!full.is_empty(), "{}: empty plan", file.display());
        assert!(quick.len() <= full.len(), "{}", file.display());
        assert!(
            !loaded.base.source.is_empty(),
            "{}: no source",
            file.display()
        );
        // Every point's topology converts to a valid emulator configuration.
        for point in &full {
            point
                .scenario
                .topology_spec(file.parent().unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
        midway_lab::check_summary(&loaded).unwrap();
    }
}

#[test]
fn the_demo_scenario_has_the_readme_cases_and_a_loss_sweep() {
    let loaded = LoadedScenario::load(&repo_root().join("scenarios/hfc-demo.toml")).unwrap();
    let cases: Vec<_> = loaded.base.cases.keys().cloned().collect();
    assert_eq!(
        cases,
        [
            "direct",
            "haproxy",
            "haproxy-tuned",
            "midway",
            "midway-spool"
        ]
    );
    let quick = build_plan(
        &loaded,
        &PlanOptions {
            quick: true,
            ..PlanOptions::default()
        },
    )
    .unwrap();
    // The loss sweep: 3 loss values x 3 cases x 1 repetition; then server-held: 2 cases, one
    // point each, at its own quick size.
    assert_eq!(quick.len(), 11);
    let server_held: Vec<_> = quick
        .iter()
        .filter(|p| p.experiment == "server-held")
        .map(|p| match &p.scenario.workload {
            midway_lab::Workload::Bulk(bulk) => (p.case.clone(), bulk.amount),
            other => panic!("not bulk: {other:?}"),
        })
        .collect();
    assert_eq!(
        server_held,
        [
            (
                "haproxy-tuned".to_string(),
                midway_lab::BulkAmount::Bytes(10_000_000)
            ),
            (
                "midway-spool".to_string(),
                midway_lab::BulkAmount::Bytes(10_000_000)
            )
        ]
    );
    let midway_bytes = match &quick[0].scenario.workload {
        midway_lab::Workload::Bulk(bulk) => bulk.amount,
        other => panic!("not bulk: {other:?}"),
    };
    assert_eq!(
        midway_bytes,
        midway_lab::BulkAmount::Bytes(300_000),
        "quick overrides apply"
    );
    let losses: Vec<f64> = quick
        .iter()
        .map(|p| {
            p.scenario
                .links
                .iter()
                .find(|l| l.name == "access")
                .unwrap()
        })
        .map(|l| l.b_to_a.data_loss.mean_rate())
        .collect();
    assert_eq!(losses[0], 0.0);
    assert_eq!(losses[8], 0.03);
}

#[test]
fn every_bad_fixture_fails_with_its_expected_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad-scenario");
    let files = files_in(&dir, "toml");
    assert!(
        files.len() >= 8,
        "expected the bad fixtures, found {}",
        files.len()
    );
    for file in &files {
        let expect_path = file.with_extension("expect");
        let expected = std::fs::read_to_string(&expect_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expect_path.display()));
        let error = match LoadedScenario::load(file) {
            Ok(_) => panic!("{} was accepted", file.display()),
            Err(error) => error.to_string(),
        };
        for needle in expected.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                error.contains(needle.trim()),
                "{}: error does not contain `{}`:\n{error}",
                file.display(),
                needle.trim()
            );
        }
    }
}

#[test]
fn the_format_example_in_the_scenarios_readme_is_valid() {
    let readme = std::fs::read_to_string(repo_root().join("scenarios/README.md")).unwrap();
    let start = readme.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + readme[start..].find("```").expect("closed block");
    let loaded = LoadedScenario::from_text(Path::new("README.md"), readme[start..end].to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.base.cases.len(), 3);
}

#[test]
fn the_web_example_in_the_scenarios_readme_is_valid() {
    let readme = std::fs::read_to_string(repo_root().join("scenarios/README.md")).unwrap();
    let section = &readme[readme.find("## Web workload").expect("a web section")..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + section[start..].find("```").expect("closed block");
    // The block shows [workload] and [cases]; the rest comes from a minimal frame.
    let text = format!(
        "name = \"readme-web\"\ndescription = \"d\"\nsource = \"s\"\n\
         [hosts.client]\n[hosts.proxy]\n[hosts.server]\n\
         [roles]\nclient = \"client\"\nproxy = \"proxy\"\nserver = \"server\"\n\
         [links.access]\na = \"client\"\nb = \"proxy\"\n\
         [links.internet]\na = \"proxy\"\nb = \"server\"\n\
         {}\n[[experiments]]\nname = \"all\"\n\
         cases = [\"direct\", \"midway-tcp\", \"midway-http\", \"squid\"]\n",
        &section[start..end]
    );
    let loaded =
        LoadedScenario::from_text(Path::new("README.md"), text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.base.cases.len(), 4);
    assert!(matches!(loaded.base.workload, midway_lab::Workload::Web(_)));
}

/// Every reproduction scenario plans, and its claims file names only experiments and cases the
/// scenario has (an operand's own `experiment` included), so a typo shows here, not as "no data"
/// at the end of a run of hours.
#[test]
fn every_reproduction_plans_and_its_claims_name_what_it_runs() {
    // The reproductions' claims, and those of a plain scenario (scenarios/NAME.claims.toml,
    // which `midway lab run` takes along, e.g. the demo's).
    let claims_files = files_in(&repo_root().join("scenarios/repro"), "toml")
        .into_iter()
        .chain(files_in(&repo_root().join("scenarios"), "toml"))
        .filter(|p| p.to_string_lossy().ends_with(".claims.toml"))
        .collect::<Vec<_>>();
    assert!(claims_files.len() >= 6, "{claims_files:?}");
    for claims_path in claims_files {
        let name = claims_path.file_name().unwrap().to_string_lossy();
        let scenario_path = claims_path
            .parent()
            .unwrap()
            .join(name.replace(".claims.toml", ".toml"));
        let loaded = LoadedScenario::load(&scenario_path).unwrap_or_else(|e| panic!("{e}"));
        build_plan(
            &loaded,
            &PlanOptions {
                quick: true,
                ..PlanOptions::default()
            },
        )
        .unwrap();
        let claims = midway_report::claims::parse(&std::fs::read_to_string(&claims_path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", claims_path.display()));
        let cases_of = |experiment: &str| -> Vec<String> {
            let found = loaded
                .file
                .experiments
                .iter()
                .find(|e| e.name.get_ref() == experiment)
                .unwrap_or_else(|| {
                    panic!("{}: no experiment `{experiment}`", claims_path.display())
                });
            found.cases.iter().map(|c| c.get_ref().clone()).collect()
        };
        // Issue 18: a claim that cannot fail is a defect. Each check is two-sided (the paper's
        // effect with a tolerance) or says why its other side is open; an unchecked claim says
        // why it is not tested.
        let problems = claims.problems();
        assert!(
            problems.is_empty(),
            "{}: {}",
            claims_path.display(),
            problems.join("\n")
        );
        let checks = claims
            .claims
            .iter()
            .chain(&claims.targets)
            .map(|claim| (&claim.says, &claim.experiment, claim.check.as_ref()))
            .chain(
                claims
                    .sanity
                    .iter()
                    .map(|sanity| (&sanity.says, &sanity.experiment, Some(&sanity.check))),
            );
        for (says, claim_experiment, check) in checks {
            cases_of(claim_experiment);
            let Some(check) = check else { continue };
            for operand in std::iter::once(&check.a).chain(check.b.as_ref()) {
                let experiment = operand.experiment.as_deref().unwrap_or(claim_experiment);
                assert!(
                    cases_of(experiment).contains(&operand.case),
                    "{}: claim `{says}` names case `{}`, which experiment `{experiment}` does not run",
                    claims_path.display(),
                    operand.case
                );
            }
        }
        for prediction in &claims.predictions {
            let cases = cases_of(&prediction.experiment);
            for case in prediction.cases.keys() {
                assert!(
                    cases.contains(case),
                    "{}: a prediction names case `{case}`, which experiment `{}` does not run",
                    claims_path.display(),
                    prediction.experiment
                );
            }
        }
        for plot in &claims.plots {
            cases_of(&plot.experiment);
        }
    }
}

#[test]
fn the_overlay_reproduction_has_the_papers_paths_and_a_competing_reno_flow() {
    use midway_lab::{BulkAmount, Workload};
    let loaded = LoadedScenario::load(&repo_root().join("scenarios/repro/overlay.toml")).unwrap();
    let quick = |cases: &[&str]| {
        build_plan(
            &loaded,
            &PlanOptions {
                quick: true,
                cases: cases.iter().map(|c| c.to_string()).collect(),
                ..PlanOptions::default()
            },
        )
        .unwrap()
    };
    let all = quick(&[]);
    // Minimum RTT: 18 ms short, 43 ms long (25 ms more, taken as round trip), both layouts;
    // 102 ms on the long fat segment (100 ms between the midways).
    let rtt_ms = |point: &midway_lab::Point| -> f64 {
        point
            .scenario
            .links
            .iter()
            .map(|l| l.a_to_b.delay.as_millis_f64() + l.b_to_a.delay.as_millis_f64())
            .sum()
    };
    for point in &all {
        let expected = if point.experiment == "long-fat" {
            102.0
        } else if point.experiment.ends_with("-long") {
            43.0
        } else {
            18.0
        };
        assert!(
            (rtt_ms(point) - expected).abs() < 0.05,
            "{}: RTT {} ms",
            point.experiment,
            rtt_ms(point)
        );
        let Workload::Bulk(bulk) = &point.scenario.workload else {
            panic!("not bulk")
        };
        assert!(
            matches!(bulk.amount, BulkAmount::For(d) if d.as_secs() <= 5),
            "the quick form runs a few seconds"
        );
        let competing = bulk.competing.as_ref();
        assert_eq!(
            competing.is_some(),
            point.experiment.starts_with("fig11"),
            "{}",
            point.experiment
        );
        if let Some(flow) = competing {
            assert_eq!(flow.congestion_control, "reno");
            assert_ne!(flow.port, bulk.port, "never intercepted by the edge");
        }
    }
    // The quick form keeps the paper's 64 KB and the largest buffer.
    let buffers: Vec<u64> = all
        .iter()
        .filter(|p| p.experiment == "fig8-9-short" && p.case == "direct")
        .map(|p| match &p.scenario.workload {
            Workload::Bulk(bulk) => bulk.client_recv_buffer.unwrap(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(buffers.first(), Some(&65536));
    assert_eq!(buffers.last(), Some(&524288));
    // What runs before the peer listener and the BPF congestion controls land: direct only.
    let direct_only = quick(&["direct"]);
    assert!(direct_only.iter().all(|p| p.case == "direct"));
    assert_eq!(
        direct_only.len(),
        9,
        "3 + 3 buffers, fig10 x 2, fig11 (long-fat has none)"
    );
}
