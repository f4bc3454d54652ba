//! The monitoring manifests of `deploy/monitoring/` against the real programs: every
//! metric the Grafana dashboard and the alerts query is one that a running controller or
//! agent exports, with the labels the queries select and group by; the alerts load in
//! promtool and fire in its unit tests. A renamed metric or label breaks this test instead
//! of leaving an empty panel or an alert that can never fire.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nfsprov_e2e::system::System;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// Labels Prometheus attaches to every scraped series itself; no exporter has them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring")
}

fn dashboard() -> serde_json::Value {
    let path = monitoring_dir().join("nfsprov-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard is readable");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn prometheus_rule() -> serde_yaml_ng::Value {
    let path = monitoring_dir().join("prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).expect("the PrometheusRule is readable");
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    fn walk<'a>(list: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn rules(rule: &serde_yaml_ng::Value) -> Vec<&serde_yaml_ng::Value> {
    rule["spec"]["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_sequence().into_iter().flatten())
        .collect()
}

/// (where, PromQL) of every query: panel targets, template variables and rules.
fn queries() -> Vec<(String, String)> {
    let dashboard = dashboard();
    let mut out = Vec::new();
    for panel in panels(&dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push((format!("panel {}", panel["title"]), expr.to_owned()));
            }
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .unwrap_or_default();
        // Grafana's `label_values(<selector>, <label>)`: the selector is PromQL, the
        // label one that selector's series must have.
        let (selector, label) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','))
            .unwrap_or_else(|| panic!("variable {}: not label_values: {query}", variable["name"]));
        out.push((
            format!("variable {}", variable["name"]),
            format!("sum by ({}) ({})", label.trim(), selector.trim()),
        ));
    }
    for rule in rules(&prometheus_rule()) {
        let name = rule["alert"].as_str().or(rule["record"].as_str());
        out.push((
            format!("rule {}", name.unwrap_or("without a name")),
            rule["expr"]
                .as_str()
                .expect("every rule has an expr")
                .to_owned(),
        ));
    }
    out
}

/// The metric and label names one PromQL expression uses.
#[derive(Debug, Default)]
struct Names {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "cos",
    "cosh",
    "count_over_time",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "deg",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_sum",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "log10",
    "log2",
    "max_over_time",
    "min_over_time",
    "minute",
    "month",
    "pi",
    "predict_linear",
    "present_over_time",
    "quantile_over_time",
    "rad",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sin",
    "sinh",
    "sort",
    "sort_desc",
    "sqrt",
    "stddev_over_time",
    "stdvar_over_time",
    "sum_over_time",
    "tan",
    "tanh",
    "time",
    "timestamp",
    "vector",
    "year",
];

/// Words that introduce a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

/// Tells metric names from functions, keywords, label names and literals. String
/// literals and everything in `[...]` (ranges, subqueries, Grafana's `$__rate_interval`)
/// are skipped; a function this does not know is an error rather than a metric name.
fn promql_names(expr: &str) -> Result<Names, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Names::default();
    let mut braces = 0usize;
    // Set after `by`, `on`, ...: the next `(` opens a list of label names.
    let mut label_list_next = false;
    let mut in_label_list = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if label_list_next && !c.is_whitespace() && c != '(' {
            // `group_left` without a list.
            label_list_next = false;
        }
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' && c != '`' {
                        i += 1;
                    }
                    i += 1;
                }
                if i >= chars.len() {
                    return Err(format!("unterminated string in {expr:?}"));
                }
                i += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '[' => match chars[i..].iter().position(|&ch| ch == ']') {
                Some(end) => i += end + 1,
                None => return Err(format!("unterminated range in {expr:?}")),
            },
            '{' => {
                braces += 1;
                i += 1;
            }
            '}' => {
                braces = braces
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced }} in {expr:?}"))?;
                i += 1;
            }
            '(' => {
                if label_list_next {
                    label_list_next = false;
                    in_label_list = true;
                }
                i += 1;
            }
            ')' => {
                in_label_list = false;
                i += 1;
            }
            '$' => {
                return Err(format!(
                    "a template variable outside a string or range in {expr:?}"
                ));
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                // A number or a duration (`offset 5m`).
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|ch| !ch.is_whitespace());
                if braces > 0 || in_label_list {
                    names.labels.insert(word);
                } else if LABEL_LISTS.contains(&word.as_str()) {
                    label_list_next = true;
                } else if KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
                    || AGGREGATIONS.contains(&word.as_str())
                {
                    // Operators and aggregations: no series of their own.
                } else if next == Some(&'(') {
                    if !FUNCTIONS.contains(&word.as_str()) {
                        return Err(format!("unknown function {word} in {expr:?}"));
                    }
                } else {
                    names.metrics.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    if braces > 0 {
        return Err(format!("unbalanced {{ in {expr:?}"));
    }
    Ok(names)
}

/// Sample names of an exposition, each with the label names its series carry. `# TYPE`
/// lines are not enough: they name a counter without its `_total` and a histogram without
/// `_bucket`, `_sum` and `_count`, which are what PromQL queries.
fn exposed(exposition: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in exposition.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_owned()).or_default();
        let Some(mut rest) = line[end..].strip_prefix('{') else {
            continue;
        };
        // name="value", ... } with escaped quotes in values.
        while let Some((name, after)) = rest.split_once("=\"") {
            labels.insert(name.trim_start_matches([',', ' ']).to_owned());
            let mut escaped = false;
            let close = after
                .char_indices()
                .find(|&(_, ch)| {
                    let found = ch == '"' && !escaped;
                    escaped = ch == '\\' && !escaped;
                    found
                })
                .map_or(after.len(), |(at, _)| at + 1);
            rest = &after[close..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    out
}

/// Waits until the first controller exports a sample of `metric` whose line holds `text`.
async fn await_controller_sample(
    system: &System,
    what: &str,
    metric: &str,
    text: &str,
) -> anyhow::Result<()> {
    let controller = &system.controllers[0];
    let start = format!("{metric}{{");
    nfsprov_e2e::eventually(what, WAIT, || async {
        controller
            .metrics()
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with(&start) && l.contains(text))
    })
    .await
}

#[test]
fn the_tokenizer_tells_metrics_from_functions_labels_and_durations() {
    let names = promql_names(
        r#"histogram_quantile(0.95, sum by (le, class) (rate(a_bucket{class=~"$class", x!="y}"}[$__rate_interval])))
          / on (class) group_left sum without (z) (b_total offset 5m) > bool 1e3 and c"#,
    )
    .unwrap();
    assert_eq!(
        names.metrics,
        ["a_bucket", "b_total", "c"].map(String::from).into()
    );
    assert_eq!(
        names.labels,
        ["class", "le", "x", "z"].map(String::from).into()
    );
    assert!(
        promql_names("rte(a[5m])")
            .unwrap_err()
            .contains("unknown function rte")
    );
    assert!(promql_names("a{b=\"c\"").is_err());
}

#[test]
fn the_exposition_reader_names_samples_and_their_labels() {
    let names = exposed(
        "# TYPE a counter\na_total{x=\"q\\\"=\\\"\",y=\"\"} 1\nb 2\nc_bucket{le=\"+Inf\"} 3\n# EOF\n",
    );
    let expected: BTreeMap<String, BTreeSet<String>> = [
        ("a_total", vec!["x", "y"]),
        ("b", vec![]),
        ("c_bucket", vec!["le"]),
    ]
    .into_iter()
    .map(|(m, l)| (m.to_owned(), l.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(names, expected);
}

#[test]
fn every_dashboard_panel_has_the_datasource_variable_and_a_query() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    assert!(
        variables.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "a datasource variable of type prometheus"
    );
    let all = panels(&dashboard);
    assert!(!all.is_empty(), "the dashboard has panels");
    let mut ids = BTreeSet::new();
    for panel in all {
        let title = &panel["title"];
        assert!(
            ids.insert(panel["id"].to_string()),
            "panel {title}: id used twice"
        );
        assert_eq!(
            panel["datasource"],
            json!({"type": "prometheus", "uid": "${datasource}"}),
            "panel {title}"
        );
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "panel {title} has no target");
        for target in targets {
            assert!(
                target["expr"]
                    .as_str()
                    .is_some_and(|e| !e.trim().is_empty()),
                "panel {title}: a target without expr"
            );
            assert!(
                target["datasource"].is_null() || target["datasource"] == panel["datasource"],
                "panel {title}: a target with another datasource"
            );
        }
    }
}

#[test]
fn every_alert_has_a_severity_a_duration_and_instructions() {
    let rule = prometheus_rule();
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(rule["metadata"]["namespace"].as_str(), Some("nfsprov"));
    let all = rules(&rule);
    assert!(!all.is_empty(), "the PrometheusRule has rules");
    for rule in all {
        let alert = rule["alert"].as_str().expect("only alerting rules");
        assert!(
            ["critical", "warning", "info"]
                .contains(&rule["labels"]["severity"].as_str().unwrap_or_default()),
            "{alert}: severity"
        );
        assert!(
            rule["for"].as_str().is_some_and(|f| !f.is_empty()),
            "{alert}: for"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|a| a.len() > 20),
                "{alert}: {annotation}"
            );
        }
    }
}

#[test]
fn the_alerts_pass_promtool_check_and_unit_tests() {
    let test = "monitoring::the_alerts_pass_promtool_check_and_unit_tests";
    if Command::new("promtool").arg("--version").output().is_err() {
        nfsprov_test_skip::skip(test, "promtool not installed (Debian package prometheus)");
        return;
    }
    // promtool reads plain rule files: the PrometheusRule's spec is one.
    let rule = prometheus_rule();
    let dir = tempfile::tempdir().unwrap();
    let rules_file = dir.path().join("nfsprov-rules.yaml");
    std::fs::write(
        &rules_file,
        serde_yaml_ng::to_string(&rule["spec"]).unwrap(),
    )
    .unwrap();
    // The unit tests name the rule file relative to themselves.
    let unit_tests = dir.path().join("rules-test.yaml");
    std::fs::copy(monitoring_dir().join("rules-test.yaml"), &unit_tests).unwrap();

    let promtool = |args: &[&Path]| {
        let output = Command::new("promtool").args(args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "promtool {args:?}:\n{text}");
        text
    };
    let checked = promtool(&[Path::new("check"), Path::new("rules"), &rules_file]);
    let count = rules(&rule).len();
    assert!(
        checked.contains(&format!("SUCCESS: {count} rules found")),
        "{checked}"
    );
    promtool(&[Path::new("test"), Path::new("rules"), &unit_tests]);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_queried_metric_and_label_is_exported_by_the_controller_or_the_agent()
-> anyhow::Result<()> {
    // Usage is measured, and orphans checked, every second instead of every few minutes,
    // so the per-claim and per-agent gauges appear within the test.
    let mut system = System::start(
        &["nfs1"],
        1,
        &[
            "--leader-elect=false",
            "--usage-interval-seconds=1",
            "--orphan-check-interval-seconds=1",
        ],
    )
    .await?;
    system
        .class(
            "e2e-monitoring",
            json!({"agent": "nfs1", "onDelete": "delete", "pathPattern": "${.PVC.annotations.app}/${.PVC.name}"}),
        )
        .await?;
    for claim in ["kept", "dropped"] {
        system
            .claim(claim, "e2e-monitoring", json!({}), json!({"app": "web"}))
            .await?;
    }
    system.bound_volume("kept", WAIT).await?;
    let dropped = system.bound_volume("dropped", WAIT).await?;
    // A path outside the export root: the failed provisioning's series.
    system
        .claim(
            "refused",
            "e2e-monitoring",
            json!({}),
            json!({"app": "../../etc"}),
        )
        .await?;
    system
        .wait_for_event("refused", "ProvisioningFailed", "")
        .await?;
    await_controller_sample(
        &system,
        "the usage of claim kept",
        "nfsprov_volume_used_bytes",
        "persistentvolumeclaim=\"kept\"",
    )
    .await?;

    // With the agent down the deletion fails (a failed deletion and an agent error by
    // code), and once it is back the deletion succeeds.
    system.agents[0].process.kill();
    system
        .claims()
        .delete("dropped", &Default::default())
        .await?;
    await_controller_sample(
        &system,
        "a failed deletion",
        "controller_persistentvolume_delete_failed_total",
        "",
    )
    .await?;
    system.agents[0].process.restart().await?;
    let dropped_name = dropped.metadata.name.clone().unwrap_or_default();
    let volumes = system.volumes();
    nfsprov_e2e::eventually("the released volume to be deleted", WAIT, || async {
        matches!(volumes.get_opt(&dropped_name).await, Ok(None))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", system.logs()))?;
    // The orphan gauges appear with the first check that reaches the agent, which can come
    // after the deletion when the checks so far all met the agent down.
    await_controller_sample(
        &system,
        "an orphan check of agent nfs1",
        "nfsprov_orphaned_directories",
        "agent=\"nfs1\"",
    )
    .await?;

    let controller_text = system.controllers[0].metrics()?;
    let agent_text = system.agents[0].process.metrics()?;
    let controller_series = exposed(&controller_text);
    let agent_series = exposed(&agent_text);

    let mut checked: BTreeMap<String, &str> = BTreeMap::new();
    let mut problems = Vec::new();
    let queries = queries();
    for (origin, expr) in &queries {
        let names = promql_names(expr).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        if names.metrics.is_empty() {
            problems.push(format!("{origin}: no metric in {expr:?}"));
        }
        let mut labels_seen: BTreeSet<&str> = TARGET_LABELS.into();
        for metric in &names.metrics {
            let found = [("controller", &controller_series), ("agent", &agent_series)]
                .into_iter()
                .find_map(|(who, series)| Some((who, series.get(metric)?)));
            match found {
                Some((who, labels)) => {
                    checked.insert(metric.clone(), who);
                    labels_seen.extend(labels.iter().map(String::as_str));
                }
                None => problems.push(format!(
                    "{origin}: metric {metric} is exported by neither the controller nor the agent"
                )),
            }
        }
        for label in &names.labels {
            if !labels_seen.contains(label.as_str()) {
                problems.push(format!(
                    "{origin}: label {label} is on no series of {:?}",
                    names.metrics
                ));
            }
        }
    }
    println!(
        "checked {} queries; metrics found in the expositions:",
        queries.len()
    );
    for (metric, who) in &checked {
        println!("  {metric} ({who})");
    }
    assert!(
        problems.is_empty(),
        "{}\n--- controller ---\n{controller_text}\n--- agent ---\n{agent_text}",
        problems.join("\n")
    );
    Ok(())
}
