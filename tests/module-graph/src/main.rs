//! `nfsprov-module-graph [CRATE_ROOT...]`: prints the import cycles between the modules of
//! each crate root given (default: every crate of the workspace), and the imports that
//! break the layer order a crate root declares, and fails if there is any. A crate root
//! that declares no order is named as such.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let given: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let roots = if given.is_empty() {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let manifest = manifest.canonicalize().unwrap_or(manifest);
        match nfsprov_module_graph::workspace_roots(&manifest) {
            Ok(roots) => roots,
            Err(e) => {
                eprintln!("nfsprov-module-graph: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        given
    };
    let mut failed = false;
    for root in roots {
        match nfsprov_module_graph::crate_graph(&root) {
            Ok(graph) => {
                let cycles = nfsprov_module_graph::cycles(&graph);
                println!(
                    "{}: {} modules, {} dependencies, {} cycles",
                    root.display(),
                    graph.modules.len(),
                    graph.edges.len(),
                    cycles.len()
                );
                for cycle in &cycles {
                    print!("{cycle}");
                }
                failed |= !cycles.is_empty();
                match nfsprov_module_graph::layer_problems(&graph) {
                    Ok(problems) => {
                        for problem in &problems {
                            println!("  {problem}");
                        }
                        failed |= problems.iter().any(|p| {
                            !matches!(p, nfsprov_module_graph::LayerProblem::NoList { .. })
                        });
                    }
                    Err(e) => {
                        eprintln!("nfsprov-module-graph: {e}");
                        failed = true;
                    }
                }
            }
            Err(e) => {
                eprintln!("nfsprov-module-graph: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
