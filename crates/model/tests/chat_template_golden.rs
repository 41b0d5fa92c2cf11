//! Every chat template in tests/fixtures/templates rendered for the conversations of
//! tests/golden/templates/cases.json must equal, byte for byte, what Python Jinja2
//! renders with Hugging Face's settings (tools/gen_template_golden.py); where
//! Python raises, strata must fail too.

mod common;

use std::collections::BTreeMap;

use minijinja::value::Value;
use strata_model::chat::{ChatInputs, ChatTemplate, DateTime, parse_json};
use strata_model::tokenizer::Tokenizer;

/// Renders strata cannot reproduce, with the reason (see the crate docs).
const KNOWN_DIVERGENCES: &[(&str, &[&str], &str)] = &[(
    "meetkai-functionary-medium-v3.1",
    &["tools_gen", "tool_call", "tool_call_gen"],
    "Jinja2's Markup: `'...'|safe + text` HTML-escapes `text`; minijinja has no Markup type",
)];

fn known_divergence(stem: &str, case: &str) -> bool {
    KNOWN_DIVERGENCES
        .iter()
        .any(|(t, cases, _)| *t == stem && cases.contains(&case))
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn field(v: &Value, key: &str) -> Value {
    v.get_attr(key).expect("a field of cases.json")
}

struct Cases {
    defs: Value,
    now: DateTime,
    bos: String,
    eos: String,
}

fn load_cases() -> Cases {
    let golden = common::golden_dir("templates");
    let cases = parse_json(&read(&golden.join("cases.json")), "cases.json").expect("cases.json");
    Cases {
        now: DateTime::parse(field(&cases, "now").as_str().expect("now")).expect("a date"),
        bos: field(&cases, "bos_token").as_str().expect("bos").to_owned(),
        eos: field(&cases, "eos_token").as_str().expect("eos").to_owned(),
        defs: field(&cases, "cases"),
    }
}

/// Renders `source` for every case of the golden `<stem>.json`; returns the
/// number of renders checked and a description of each mismatch.
fn check_template(cases: &Cases, stem: &str, source: &str) -> (usize, Vec<String>) {
    let golden = common::golden_dir("templates").join(format!("{stem}.json"));
    let expected: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&read(&golden)).expect("golden JSON");
    let template = ChatTemplate::new(source);
    let mut failures = Vec::new();
    for (case_name, want) in &expected {
        let def = field(&cases.defs, case_name);
        let tools = def.get_attr("tools").ok().filter(|t| !t.is_undefined());
        let inputs = ChatInputs {
            messages: field(&def, "messages"),
            tools,
            add_generation_prompt: field(&def, "add_generation_prompt").is_true(),
            bos_token: cases.bos.clone(),
            eos_token: cases.eos.clone(),
            extra: Vec::new(),
            now: Some(cases.now),
        };
        let got = template
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|t| t.render(&inputs).map_err(|e| e.to_string()));
        let outcome = (want.get("output").and_then(|o| o.as_str()), got);
        if known_divergence(stem, case_name) {
            assert!(
                !matches!(&outcome, (Some(w), Ok(g)) if w == g),
                "{stem} / {case_name} now matches Jinja2: remove it from KNOWN_DIVERGENCES"
            );
            continue;
        }
        match outcome {
            (Some(w), Ok(g)) if w == g => {}
            (Some(w), Ok(g)) => failures.push(format!(
                "{stem} / {case_name}: output differs\n--- jinja2\n{w}\n--- strata\n{g}\n---"
            )),
            (Some(_), Err(e)) => failures.push(format!("{stem} / {case_name}: strata failed: {e}")),
            (None, Ok(g)) => failures.push(format!(
                "{stem} / {case_name}: jinja2 raised ({}) but strata rendered:\n{g}",
                want.get("raises").and_then(|r| r.as_str()).unwrap_or("?")
            )),
            (None, Err(_)) => {}
        }
    }
    (expected.len(), failures)
}

#[test]
fn templates_match_jinja2() {
    let cases = load_cases();
    let mut templates: Vec<_> =
        std::fs::read_dir(common::repo_root().join("tests/fixtures/templates"))
            .expect("templates dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
            .collect();
    templates.sort();
    assert!(templates.len() >= 60, "only {} templates", templates.len());

    let mut failures = Vec::new();
    let mut checked = 0;
    for path in &templates {
        let stem = path.file_stem().and_then(|s| s.to_str()).expect("name");
        let (n, f) = check_template(&cases, stem, &read(path));
        checked += n;
        failures.extend(f);
    }
    assert!(checked > 400, "only {checked} renders checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} renders differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The templates stored in GGUF files, read through the tokenizer.
#[test]
fn gguf_templates_match_jinja2() {
    let cases = load_cases();
    let mut files: Vec<_> = ["ggml-vocab-phi-3.gguf", "ggml-vocab-qwen2.gguf"]
        .iter()
        .map(|f| common::vocab_dir().join(f))
        .collect();
    files.extend(common::smollm2());
    let mut failures = Vec::new();
    for path in &files {
        let tok = Tokenizer::from_gguf_file(path).expect("tokenizer");
        let source = tok.chat_template().expect("a chat template");
        let stem = format!(
            "gguf-{}",
            path.file_stem().and_then(|s| s.to_str()).expect("name")
        );
        let (n, f) = check_template(&cases, &stem, source);
        assert!(n >= 6, "{stem}: {n} cases");
        failures.extend(f);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn raise_exception_names_the_message_and_line() {
    let path = common::repo_root().join("tests/fixtures/templates/google-gemma-2-2b-it.jinja");
    let template = ChatTemplate::new(&read(&path)).expect("compiles");
    let mut inputs = ChatInputs::from_json(
        r#"[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]"#,
        None,
    )
    .expect("messages");
    inputs.bos_token = "<bos>".into();
    match template.render(&inputs) {
        Err(strata_model::chat::ChatError::Raised {
            line: Some(line),
            message,
        }) => {
            assert_eq!(message, "System role not supported");
            let source = read(&path);
            let text = source.lines().nth(line - 1).expect("the line exists");
            assert!(text.contains("raise_exception"), "line {line} is `{text}`");
        }
        other => panic!("expected a raised exception, got {other:?}"),
    }
}

#[test]
fn syntax_errors_name_the_line() {
    match ChatTemplate::new("line one\n{% if x %}\n{{ oops( }}\n{% endif %}") {
        Err(strata_model::chat::ChatError::Syntax { line: Some(3), .. }) => {}
        Err(e) => panic!("wrong error: {e:?}"),
        Ok(_) => panic!("compiled a broken template"),
    }
}
