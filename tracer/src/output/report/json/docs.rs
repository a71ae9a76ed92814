//! The fields of `docs/json.md`, generated from the report's types: a table for each
//! block of [`AttachJson`], each block followed by those it holds, with each field's doc
//! comment as its meaning. The prose around the tables is written by hand.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::AttachJson;
use crate::output::{golden::assert_golden_file, markdown::slug};

/// The markers around the generated part of `docs/json.md`.
const BEGIN: &str = "<!-- Generated from tracer/src/output/report/json.rs: \
                     TRACER_BLESS=1 cargo test -p tracer json::docs rewrites it. -->";
const END: &str = "<!-- End of the generated part. -->";

/// An object of the document whose fields get a table.
struct Block<'s> {
    /// Where it sits in the document (`latencies.NAME.per_process[]`); empty for the root.
    path: String,
    schema: &'s Value,
}

/// What a field holds, in words, and the block it leads to, if any.
struct FieldType {
    /// The type in words, with `{object}` where the link to its block goes.
    words: String,
    /// The definition of the block it leads to, and what its path adds to the field's.
    block: Option<(String, &'static str)>,
}

/// The doc comment of a field or type, on one line. (The root's `title` is its type's
/// name, not meant for readers.)
fn meaning(schema: &Value) -> String {
    schema["description"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn definition(reference: &str) -> String {
    reference
        .strip_prefix("#/$defs/")
        .unwrap_or_else(|| panic!("a reference outside $defs: {reference}"))
        .to_string()
}

fn plural(word: &str) -> String {
    match word {
        "{object}" => "{objects}".to_string(),
        word => format!("{word}s"),
    }
}

/// The type of a field, from its schema.
fn field_type(schema: &Value) -> FieldType {
    if let Some(reference) = schema["$ref"].as_str() {
        return FieldType {
            words: "{object}".to_string(),
            block: Some((definition(reference), "")),
        };
    }
    if let Some(choices) = schema["anyOf"].as_array() {
        let others: Vec<&Value> = choices.iter().filter(|c| c["type"] != "null").collect();
        assert!(
            others.len() == 1 && choices.len() == 2,
            "only `T or null` is described: {schema}"
        );
        let inner = field_type(others[0]);
        return FieldType {
            words: format!("{} or null", inner.words),
            ..inner
        };
    }
    match &schema["type"] {
        Value::String(kind) if kind == "array" => {
            let inner = field_type(&schema["items"]);
            FieldType {
                words: format!("array of {}", plural(&inner.words)),
                block: inner.block.map(|(def, _)| (def, "[]")),
            }
        }
        Value::String(kind) if kind == "object" => {
            let inner = field_type(&schema["additionalProperties"]);
            FieldType {
                words: format!("map of {}", plural(&inner.words)),
                block: inner.block.map(|(def, _)| (def, ".NAME")),
            }
        }
        Value::String(kind) => FieldType {
            words: kind.clone(),
            block: None,
        },
        Value::Array(kinds) => FieldType {
            words: kinds
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" or "),
            block: None,
        },
        _ => panic!("a field of no type: {schema}"),
    }
}

/// The heading of the block at `path`.
fn heading(path: &str) -> String {
    format!("`{path}`")
}

/// The markdown of every block's table: the document's own first, each block followed
/// by the blocks its fields lead to.
fn field_tables(root: &Value) -> String {
    let empty = Map::new();
    let definitions = root["$defs"].as_object().unwrap_or(&empty);
    // Each definition's block path: the first field that leads to it names it.
    let mut paths: BTreeMap<String, String> = BTreeMap::new();
    let mut blocks = vec![Block {
        path: String::new(),
        schema: root,
    }];
    let mut out = String::new();
    while let Some(block) = blocks.pop() {
        if !block.path.is_empty() {
            out.push_str(&format!("\n### {}\n\n", heading(&block.path)));
        }
        out.push_str(&format!(
            "{}\n\n| field | type | meaning |\n|---|---|---|\n",
            meaning(block.schema)
        ));
        let properties = block.schema["properties"].as_object().unwrap_or(&empty);
        let fields = properties.iter().map(|(name, field)| (name.clone(), field));
        // A flattened map (the classes): any other key, named by the data.
        let others = block.schema["additionalProperties"]
            .is_object()
            .then(|| ("NAME".to_string(), &block.schema["additionalProperties"]));
        let mut held = Vec::new();
        for (name, field) in fields.chain(others) {
            let kind = field_type(field);
            let words = match kind.block {
                None => kind.words,
                Some((def, suffix)) => {
                    let path = paths.entry(def.clone()).or_insert_with(|| {
                        let path = match block.path.as_str() {
                            "" => format!("{name}{suffix}"),
                            parent => format!("{parent}.{name}{suffix}"),
                        };
                        held.push(Block {
                            path: path.clone(),
                            schema: &definitions[&def],
                        });
                        path
                    });
                    let anchor = slug(&heading(path));
                    kind.words
                        .replace("{objects}", &format!("[objects](#{anchor})"))
                        .replace("{object}", &format!("[object](#{anchor})"))
                }
            };
            let text = match meaning(field) {
                text if !text.is_empty() => text,
                // A key named by the data takes the meaning of what it holds.
                _ if name == "NAME" => {
                    meaning(&definitions[&definition(field["$ref"].as_str().unwrap_or_default())])
                }
                _ => panic!("`{name}` of `{}` has no doc comment", block.path),
            };
            out.push_str(&format!("| `{name}` | {words} | {text} |\n"));
        }
        blocks.extend(held.into_iter().rev());
    }
    out
}

#[test]
fn docs_json_md_lists_every_field_of_the_attach_report() {
    let schema = schemars::schema_for!(AttachJson<'static>);
    let tables = field_tables(schema.as_value());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/json.md");
    let page = std::fs::read_to_string(&path).expect("docs/json.md is there");
    let (before, rest) = page
        .split_once(BEGIN)
        .expect("docs/json.md has the generated part's first marker");
    let (_, after) = rest
        .split_once(END)
        .expect("docs/json.md has the generated part's last marker");
    assert_golden_file(&path, &format!("{before}{BEGIN}\n\n{tables}\n{END}{after}"));
}
