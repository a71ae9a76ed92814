//! The floor plan, checked: each area of `tracer/src` uses only the areas below it (the
//! list in [`ALLOWED`]), aya is spoken only in `kernel/`, and no two areas use each other,
//! directly or around a circle.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and its unit tests (which may reach anywhere).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The area a file belongs to (`kernel` for `src/kernel/keeper.rs`).
fn module_of(path: &Path) -> String {
    let relative = path.strip_prefix(src()).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_owned()
}

fn files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    source_files(&src(), &mut files);
    files.sort();
    files
}

#[test]
fn no_aya_name_outside_the_kernel() {
    let offenders: Vec<String> = files()
        .into_iter()
        .filter(|f| module_of(f) != "kernel")
        .filter(|f| {
            let code = code(f);
            code.contains("aya::") || code.contains("aya_obj::") || code.contains("use aya")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "aya outside kernel/: {offenders:?}");
}

/// Which top-level modules each one uses: `crate::NAME` paths and `use crate::{NAME, ..}`.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = files().iter().map(|f| module_of(f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files() {
        let from = module_of(&file);
        if from == "main" || from == "lib" {
            continue;
        }
        let code = code(&file);
        let mut used = BTreeSet::new();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level names of a group: after `{` or a comma at depth one.
                let mut depth = 0;
                let mut name = String::new();
                let mut expecting = true;
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => expecting = true,
                        c if expecting && (c.is_alphanumeric() || c == '_') => name.push(c),
                        _ if expecting && !name.is_empty() => {
                            used.insert(std::mem::take(&mut name));
                            expecting = false;
                        }
                        _ => {}
                    }
                }
                if !name.is_empty() {
                    used.insert(name);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                used.insert(name);
            }
        }
        used.retain(|m| modules.contains(m) && *m != from);
        graph.entry(from).or_default().extend(used);
    }
    graph
}

#[test]
fn no_import_circle_between_modules() {
    let graph = module_graph();
    // Depth-first search for a path that comes back to where it started.
    fn circle(
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        let here = path.last().unwrap().clone();
        for next in graph.get(&here).into_iter().flatten() {
            if let Some(at) = path.iter().position(|m| m == next) {
                let mut found = path[at..].to_vec();
                found.push(next.clone());
                return Some(found);
            }
            if done.contains(next) {
                continue;
            }
            path.push(next.clone());
            if let Some(found) = circle(graph, path, done) {
                return Some(found);
            }
            path.pop();
        }
        done.insert(here);
        None
    }
    let mut done = BTreeSet::new();
    for start in graph.keys() {
        if let Some(found) = circle(&graph, &mut vec![start.clone()], &mut done) {
            panic!("import circle: {}", found.join(" -> "));
        }
    }
    // The check sees the graph at all: commands use the kernel.
    assert!(graph["commands"].contains("kernel"));
}

/// Each area and the areas it may use: the layers, lowest first. An area not listed here
/// fails the test, so a new one is placed on purpose.
const ALLOWED: &[(&str, &[&str])] = &[
    ("system", &[]),
    ("kernel", &["system"]),
    ("target", &["system", "kernel"]),
    ("stack", &["system", "kernel"]),
    ("probe", &["system", "kernel", "stack"]),
    ("profile", &["system", "kernel", "stack", "target"]),
    // Reports and renderings are made of aggregates, never read from the kernel.
    ("output", &["system", "stack", "probe", "profile"]),
    // Nothing but the commands and the entry points depend on the command line.
    ("session", &["system", "kernel", "target"]),
    ("cli", &["system", "kernel", "target", "probe", "profile"]),
    (
        "commands",
        &[
            "system", "kernel", "target", "stack", "probe", "profile", "output", "session", "cli",
        ],
    ),
];

#[test]
fn each_area_uses_only_the_areas_below_it() {
    let graph = module_graph();
    let mut wrong = Vec::new();
    for (area, uses) in &graph {
        let Some((_, allowed)) = ALLOWED.iter().find(|(name, _)| name == area) else {
            wrong.push(format!("{area}: not an area listed in ALLOWED"));
            continue;
        };
        for used in uses {
            if !allowed.contains(&used.as_str()) {
                wrong.push(format!("{area} uses {used}"));
            }
        }
    }
    assert!(wrong.is_empty(), "arrows against the layers: {wrong:?}");
    // The check sees the graph at all: the kernel uses the system area.
    assert!(graph["kernel"].contains("system"));
}

#[test]
fn the_source_root_holds_only_areas_and_entry_points() {
    let mut loose: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| {
            let area = name.trim_end_matches(".rs");
            !["lib", "main"].contains(&area) && !ALLOWED.iter().any(|(a, _)| *a == area)
        })
        .collect();
    loose.sort();
    assert!(
        loose.is_empty(),
        "files at the root of tracer/src outside any area: {loose:?}"
    );
}
