//! `pathPattern` templates: parsed once per StorageClass, rendered per claim.
//!
//! Values substituted from labels and annotations are untrusted. A value may never contain
//! `/`, so only the literal slashes an administrator wrote in the class create directory
//! levels; whatever the rendering yields must then pass [`VolumePath::parse`], the same
//! validator the agent applies, so nothing can name a path outside the export root.

use std::collections::BTreeMap;
use std::fmt;

use nfsprov_api_types::{PathError, VolumePath};

/// The peers' naming: `<namespace>-<claim>-<pv>`.
pub const DEFAULT_PATTERN: &str = "${.PVC.namespace}-${.PVC.name}-${.PV.name}";

/// Longest value taken from a label or annotation before validation even looks at it, so a
/// huge annotation costs nothing to reject.
const MAX_VALUE_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Variable {
    PvcNamespace,
    PvcName,
    PvcLabel(String),
    PvcAnnotation(String),
    PvName,
}

impl fmt::Display for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Variable::PvcNamespace => f.write_str("${.PVC.namespace}"),
            Variable::PvcName => f.write_str("${.PVC.name}"),
            Variable::PvcLabel(key) => write!(f, "${{.PVC.labels.{key}}}"),
            Variable::PvcAnnotation(key) => write!(f, "${{.PVC.annotations.{key}}}"),
            Variable::PvName => f.write_str("${.PV.name}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Variable(Variable),
}

/// A parsed `pathPattern`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    source: String,
    segments: Vec<Segment>,
}

/// Why a `pathPattern` parameter is not a valid template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("pathPattern is empty")]
    Empty,
    #[error("pathPattern has an unterminated \"${{\" at byte {0}")]
    Unterminated(usize),
    #[error(
        "pathPattern uses unknown variable \"${{{0}}}\"; known: ${{.PVC.namespace}}, ${{.PVC.name}}, ${{.PVC.labels.KEY}}, ${{.PVC.annotations.KEY}}, ${{.PV.name}}"
    )]
    UnknownVariable(String),
}

/// Why a pattern could not be rendered into a safe volume path for one claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("{variable} is {len} bytes long; at most {MAX_VALUE_BYTES} are allowed")]
    ValueTooLong { variable: String, len: usize },
    #[error("{variable} contains '/', which is not allowed in a substituted value")]
    ValueHasSlash { variable: String },
    #[error(
        "pathPattern {pattern:?} rendered to {rendered:?}, which is not a valid volume path: {source}"
    )]
    InvalidPath {
        pattern: String,
        rendered: String,
        #[source]
        source: PathError,
    },
}

/// What a pattern can refer to.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    pub pvc_namespace: &'a str,
    pub pvc_name: &'a str,
    pub pvc_labels: Option<&'a BTreeMap<String, String>>,
    pub pvc_annotations: Option<&'a BTreeMap<String, String>>,
    pub pv_name: &'a str,
}

impl PathPattern {
    pub fn parse(source: &str) -> Result<Self, PatternError> {
        if source.trim().is_empty() {
            return Err(PatternError::Empty);
        }
        let mut segments = Vec::new();
        let mut rest = source;
        let mut offset = 0;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                segments.push(Segment::Literal(rest[..start].to_owned()));
            }
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .ok_or(PatternError::Unterminated(offset + start))?;
            segments.push(Segment::Variable(parse_variable(after[..end].trim())?));
            let consumed = start + 2 + end + 1;
            offset += consumed;
            rest = &rest[consumed..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.to_owned()));
        }
        Ok(Self {
            source: source.to_owned(),
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Renders the pattern for one claim and validates the result as a volume path.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<VolumePath, RenderError> {
        let mut rendered = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => rendered.push_str(text),
                Segment::Variable(variable) => {
                    let value = match variable {
                        Variable::PvcNamespace => input.pvc_namespace,
                        Variable::PvcName => input.pvc_name,
                        Variable::PvName => input.pv_name,
                        // A missing key renders empty, as the peers do; the path validator
                        // then rejects a component left empty by it.
                        Variable::PvcLabel(key) => lookup(input.pvc_labels, key),
                        Variable::PvcAnnotation(key) => lookup(input.pvc_annotations, key),
                    };
                    if value.len() > MAX_VALUE_BYTES {
                        return Err(RenderError::ValueTooLong {
                            variable: variable.to_string(),
                            len: value.len(),
                        });
                    }
                    if value.contains('/') {
                        return Err(RenderError::ValueHasSlash {
                            variable: variable.to_string(),
                        });
                    }
                    rendered.push_str(value);
                }
            }
        }
        VolumePath::parse(&rendered).map_err(|source| RenderError::InvalidPath {
            pattern: self.source.clone(),
            rendered,
            source,
        })
    }
}

impl Default for PathPattern {
    fn default() -> Self {
        Self::parse(DEFAULT_PATTERN).unwrap_or_else(|_| Self {
            source: DEFAULT_PATTERN.to_owned(),
            segments: Vec::new(),
        })
    }
}

fn lookup<'a>(map: Option<&'a BTreeMap<String, String>>, key: &str) -> &'a str {
    map.and_then(|m| m.get(key))
        .map(String::as_str)
        .unwrap_or("")
}

fn parse_variable(name: &str) -> Result<Variable, PatternError> {
    let unknown = || PatternError::UnknownVariable(name.to_owned());
    match name {
        ".PVC.namespace" => Ok(Variable::PvcNamespace),
        ".PVC.name" => Ok(Variable::PvcName),
        ".PV.name" => Ok(Variable::PvName),
        _ => {
            if let Some(key) = name.strip_prefix(".PVC.labels.") {
                if key.is_empty() {
                    return Err(unknown());
                }
                Ok(Variable::PvcLabel(key.to_owned()))
            } else if let Some(key) = name.strip_prefix(".PVC.annotations.") {
                if key.is_empty() {
                    return Err(unknown());
                }
                Ok(Variable::PvcAnnotation(key.to_owned()))
            } else {
                Err(unknown())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(
        labels: &'a BTreeMap<String, String>,
        annotations: &'a BTreeMap<String, String>,
    ) -> RenderInput<'a> {
        RenderInput {
            pvc_namespace: "team-a",
            pvc_name: "data",
            pvc_labels: Some(labels),
            pvc_annotations: Some(annotations),
            pv_name: "pvc-0b9f6d2e-1c3a-4c5e-9a7b-2f4e6d8c0a1b",
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn default_pattern_is_the_peers_naming() {
        let empty = BTreeMap::new();
        let path = PathPattern::default()
            .render(&input(&empty, &empty))
            .unwrap();
        assert_eq!(
            path.as_str(),
            "team-a-data-pvc-0b9f6d2e-1c3a-4c5e-9a7b-2f4e6d8c0a1b"
        );
    }

    #[test]
    fn renders_every_variable_and_nested_literals() {
        let labels = map(&[("app", "db"), ("app.kubernetes.io/tier", "x")]);
        let annotations = map(&[("example.com/owner", "alice")]);
        let pattern = PathPattern::parse(
            "${.PVC.namespace}/${.PVC.labels.app}/${.PVC.annotations.example.com/owner}-${.PVC.name}/${.PV.name}",
        )
        .unwrap();
        let path = pattern.render(&input(&labels, &annotations)).unwrap();
        assert_eq!(
            path.as_str(),
            "team-a/db/alice-data/pvc-0b9f6d2e-1c3a-4c5e-9a7b-2f4e6d8c0a1b"
        );
        // Keys may contain '/', values may not: the key above was looked up whole.
        let pattern = PathPattern::parse("${.PVC.labels.app.kubernetes.io/tier}").unwrap();
        assert_eq!(
            pattern
                .render(&input(&labels, &annotations))
                .unwrap()
                .as_str(),
            "x"
        );
    }

    #[test]
    fn bad_templates_are_refused_at_parse_time() {
        assert_eq!(PathPattern::parse(""), Err(PatternError::Empty));
        assert_eq!(
            PathPattern::parse("a-${.PVC.name"),
            Err(PatternError::Unterminated(2))
        );
        for bad in [
            "${.PVC.uid}",
            "${PVC.name}",
            "${.PVC.labels.}",
            "${}",
            "${.Env.HOME}",
        ] {
            assert!(
                matches!(
                    PathPattern::parse(bad),
                    Err(PatternError::UnknownVariable(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn hostile_values_never_escape_the_root() {
        let pattern = PathPattern::parse("${.PVC.annotations.dir}").unwrap();
        let nested = PathPattern::parse("vols/${.PVC.annotations.dir}/x").unwrap();
        let long = "a".repeat(300);
        let huge = "a".repeat(MAX_VALUE_BYTES + 1);
        let hostile = [
            "..",
            ".",
            "../../etc",
            "/etc/passwd",
            "a/../../b",
            "",
            ".hidden",
            ".archive",
            "tëst",
            "日本語",
            "a b",
            "a\0b",
            "a\\b",
            "a\nb",
            long.as_str(),
            huge.as_str(),
        ];
        let labels = BTreeMap::new();
        for value in hostile {
            let annotations = map(&[("dir", value)]);
            for p in [&pattern, &nested] {
                let result = p.render(&input(&labels, &annotations));
                assert!(
                    result.is_err(),
                    "{value:?} in {:?} gave {result:?}",
                    p.as_str()
                );
            }
        }
        // The slash check fires before path validation, so a value can never add a level.
        let annotations = map(&[("dir", "other-ns/claim")]);
        assert_eq!(
            nested.render(&input(&labels, &annotations)),
            Err(RenderError::ValueHasSlash {
                variable: "${.PVC.annotations.dir}".into()
            })
        );
    }

    #[test]
    fn missing_keys_render_empty_and_empty_components_fail() {
        let empty = BTreeMap::new();
        let pattern = PathPattern::parse("x/${.PVC.labels.missing}/y").unwrap();
        let err = pattern.render(&input(&empty, &empty)).unwrap_err();
        assert!(
            matches!(
                err,
                RenderError::InvalidPath {
                    source: PathError::EmptyComponent,
                    ..
                }
            ),
            "{err}"
        );
        let leading = PathPattern::parse("${.PVC.labels.missing}/x").unwrap();
        assert!(matches!(
            leading.render(&input(&empty, &empty)),
            Err(RenderError::InvalidPath {
                source: PathError::Absolute,
                ..
            })
        ));
        // Absent maps behave like empty ones.
        let mut no_maps = input(&empty, &empty);
        no_maps.pvc_labels = None;
        no_maps.pvc_annotations = None;
        let pattern = PathPattern::parse("p-${.PVC.labels.app}").unwrap();
        assert_eq!(pattern.render(&no_maps).unwrap().as_str(), "p-");
    }

    #[test]
    fn valid_unusual_values_pass() {
        let labels = map(&[("v", "a..b"), ("u", "A_b-9.c")]);
        let empty = BTreeMap::new();
        let pattern = PathPattern::parse("${.PVC.labels.v}/${.PVC.labels.u}").unwrap();
        assert_eq!(
            pattern.render(&input(&labels, &empty)).unwrap().as_str(),
            "a..b/A_b-9.c"
        );
        let long = map(&[("v", &"a".repeat(255))]);
        let pattern = PathPattern::parse("${.PVC.labels.v}").unwrap();
        assert!(pattern.render(&input(&long, &empty)).is_ok());
        let too_long = map(&[("v", &"a".repeat(256))]);
        assert!(matches!(
            pattern.render(&input(&too_long, &empty)),
            Err(RenderError::InvalidPath {
                source: PathError::ComponentTooLong { len: 256 },
                ..
            })
        ));
    }
}
