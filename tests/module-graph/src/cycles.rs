//! The cycles of a graph: one per strongly connected component of two or more modules
//! (Tarjan's algorithm), each given as the edges that close it.

use std::fmt;

use crate::graph::{Edge, Graph};

/// Modules that depend on each other: all of them, and one ring through them with the
/// edges in order.
#[derive(Debug)]
pub struct Cycle {
    pub modules: Vec<String>,
    pub steps: Vec<(String, String, String)>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "import cycle among {}; for example:",
            self.modules.join(", ")
        )?;
        for (from, to, at) in &self.steps {
            writeln!(f, "  {from} -> {to}  ({at})")?;
        }
        Ok(())
    }
}

pub fn cycles(graph: &Graph) -> Vec<Cycle> {
    let n = graph.modules.len();
    let mut next: Vec<Vec<&Edge>> = vec![Vec::new(); n];
    for edge in &graph.edges {
        next[edge.from].push(edge);
    }
    components(n, &next)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| ring(graph, &next, &component))
        .collect()
}

/// Strongly connected components, iteratively (no recursion on deep graphs).
fn components(n: usize, next: &[Vec<&Edge>]) -> Vec<Vec<usize>> {
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut counter = 0;
    let mut found = Vec::new();
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0usize)];
        while let Some(&mut (node, ref mut position)) = work.last_mut() {
            if *position == 0 && index[node] == usize::MAX {
                index[node] = counter;
                low[node] = counter;
                counter += 1;
                stack.push(node);
                on_stack[node] = true;
            }
            if let Some(edge) = next[node].get(*position) {
                *position += 1;
                let to = edge.to;
                if index[to] == usize::MAX {
                    work.push((to, 0));
                } else if on_stack[to] {
                    low[node] = low[node].min(index[to]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == index[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                found.push(component);
            }
        }
    }
    found
}

/// A shortest ring through the component's first module, found breadth-first.
fn ring(graph: &Graph, next: &[Vec<&Edge>], component: &[usize]) -> Cycle {
    let start = *component.iter().min().unwrap_or(&0);
    let inside = |m: usize| component.contains(&m);
    let mut came_by: Vec<Option<&Edge>> = vec![None; graph.modules.len()];
    let mut queue = std::collections::VecDeque::from([start]);
    let mut closing = None;
    'search: while let Some(node) = queue.pop_front() {
        for edge in &next[node] {
            if edge.to == start {
                closing = Some(*edge);
                break 'search;
            }
            if inside(edge.to) && came_by[edge.to].is_none() {
                came_by[edge.to] = Some(edge);
                queue.push_back(edge.to);
            }
        }
    }
    let mut edges = Vec::new();
    if let Some(last) = closing {
        edges.push(last);
        let mut at = last.from;
        while at != start {
            let Some(edge) = came_by[at] else { break };
            edges.push(edge);
            at = edge.from;
        }
    }
    edges.reverse();
    let mut modules: Vec<String> = component.iter().map(|&m| graph.modules[m].name()).collect();
    modules.sort();
    Cycle {
        modules,
        steps: edges
            .into_iter()
            .map(|e| {
                (
                    graph.modules[e.from].name(),
                    graph.modules[e.to].name(),
                    e.at.to_string(),
                )
            })
            .collect(),
    }
}
