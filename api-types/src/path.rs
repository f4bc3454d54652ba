//! The one validator for volume paths. The agent and the controller both call it, so a
//! path the controller renders is accepted by the agent exactly when it is safe there.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Most components a volume path may have (`ns/team/claim` style patterns need a few).
pub const MAX_COMPONENTS: usize = 8;
/// Longest single component, in bytes (the usual `NAME_MAX`).
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Longest whole path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Why a string is not a valid volume path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path must be relative (it starts with '/')")]
    Absolute,
    #[error("path is {len} bytes long; the limit is {MAX_PATH_BYTES}")]
    TooLong { len: usize },
    #[error("path has {count} components; the limit is {MAX_COMPONENTS}")]
    TooManyComponents { count: usize },
    #[error("path has an empty component (a doubled or trailing '/')")]
    EmptyComponent,
    #[error("component {component:?} starts with '.' (hidden names, '.' and '..' are not allowed)")]
    DotComponent { component: String },
    #[error(
        "component {component:?} contains {ch:?}; only A-Z, a-z, 0-9, '.', '_' and '-' are allowed"
    )]
    InvalidCharacter { component: String, ch: char },
    #[error("a component is {len} bytes long; the limit is {MAX_COMPONENT_BYTES}")]
    ComponentTooLong { len: usize },
}

/// A relative path beneath the export root that passed [`VolumePath::parse`].
///
/// Components are `[A-Za-z0-9._-]+`, never start with `.` (which also rules out `.`, `..`
/// and every hidden name the agent keeps for itself), and are joined by single `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct VolumePath(String);

impl VolumePath {
    /// Validates `raw` and returns it as a volume path.
    pub fn parse(raw: &str) -> Result<Self, PathError> {
        if raw.is_empty() {
            return Err(PathError::Empty);
        }
        if raw.starts_with('/') {
            return Err(PathError::Absolute);
        }
        if raw.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong { len: raw.len() });
        }
        let count = raw.split('/').count();
        if count > MAX_COMPONENTS {
            return Err(PathError::TooManyComponents { count });
        }
        for component in raw.split('/') {
            validate_component(component)?;
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this path lies beneath `prefix`, component by component: `team-a/app` is
    /// beneath `team-a`, but neither `team-a` itself nor `team-ab/app` is.
    pub fn is_beneath(&self, prefix: &VolumePath) -> bool {
        self.0
            .strip_prefix(prefix.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The components, in order from the export root.
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &str> + Clone {
        self.0.split('/')
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// The path without its last component, or `None` for a one-component path.
    pub fn parent(&self) -> Option<VolumePath> {
        self.0
            .rsplit_once('/')
            .map(|(parent, _)| VolumePath(parent.to_owned()))
    }
}

/// Validates one component on its own (also used to check single names such as a PV name
/// before they are put into a path).
pub fn validate_component(component: &str) -> Result<(), PathError> {
    if component.is_empty() {
        return Err(PathError::EmptyComponent);
    }
    if component.len() > MAX_COMPONENT_BYTES {
        return Err(PathError::ComponentTooLong {
            len: component.len(),
        });
    }
    if component.starts_with('.') {
        return Err(PathError::DotComponent {
            component: component.to_owned(),
        });
    }
    if let Some(ch) = component
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(PathError::InvalidCharacter {
            component: component.to_owned(),
            ch,
        });
    }
    Ok(())
}

impl fmt::Display for VolumePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for VolumePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for VolumePath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for VolumePath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        VolumePath::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beneath_a_prefix_means_by_whole_components() {
        let p = |raw: &str| VolumePath::parse(raw).unwrap();
        assert!(p("team-a/app").is_beneath(&p("team-a")));
        assert!(p("team-a/x/y").is_beneath(&p("team-a/x")));
        assert!(!p("team-a").is_beneath(&p("team-a")));
        assert!(!p("team-ab/app").is_beneath(&p("team-a")));
        assert!(!p("team-b/app").is_beneath(&p("team-a")));
        assert!(!p("team-a").is_beneath(&p("team-a/app")));
    }

    #[test]
    fn accepts_ordinary_paths() {
        for ok in [
            "a",
            "default-data-pvc-1234",
            "ns/claim",
            "a.b_c-d/E9",
            "x/y/z/w",
            "a..b",
            &"n".repeat(255),
        ] {
            let path = VolumePath::parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            assert_eq!(path.as_str(), ok);
        }
    }

    #[test]
    fn rejects_hostile_paths() {
        let long_component = "n".repeat(256);
        let cases: &[(&str, PathError)] = &[
            ("", PathError::Empty),
            ("/etc", PathError::Absolute),
            ("a//b", PathError::EmptyComponent),
            ("a/", PathError::EmptyComponent),
            (
                "..",
                PathError::DotComponent {
                    component: "..".into(),
                },
            ),
            (
                "a/../b",
                PathError::DotComponent {
                    component: "..".into(),
                },
            ),
            (
                ".",
                PathError::DotComponent {
                    component: ".".into(),
                },
            ),
            (
                ".archive/x",
                PathError::DotComponent {
                    component: ".archive".into(),
                },
            ),
            (
                "a\0b",
                PathError::InvalidCharacter {
                    component: "a\0b".into(),
                    ch: '\0',
                },
            ),
            (
                "a b",
                PathError::InvalidCharacter {
                    component: "a b".into(),
                    ch: ' ',
                },
            ),
            (
                "a\\b",
                PathError::InvalidCharacter {
                    component: "a\\b".into(),
                    ch: '\\',
                },
            ),
            (
                "é",
                PathError::InvalidCharacter {
                    component: "é".into(),
                    ch: 'é',
                },
            ),
            (&long_component, PathError::ComponentTooLong { len: 256 }),
            (
                "a/b/c/d/e/f/g/h/i",
                PathError::TooManyComponents { count: 9 },
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(VolumePath::parse(raw).as_ref(), Err(expected), "{raw:?}");
        }
        let too_long = vec!["n".repeat(200); 6].join("/");
        assert_eq!(
            VolumePath::parse(&too_long),
            Err(PathError::TooLong {
                len: too_long.len()
            })
        );
    }

    #[test]
    fn parent_and_file_name() {
        let p = VolumePath::parse("a/b/c").unwrap();
        assert_eq!(p.file_name(), "c");
        assert_eq!(p.parent().unwrap().as_str(), "a/b");
        assert_eq!(VolumePath::parse("a").unwrap().parent(), None);
        assert_eq!(p.components().collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn deserialization_validates() {
        assert!(serde_json::from_str::<VolumePath>("\"../x\"").is_err());
        assert_eq!(
            serde_json::from_str::<VolumePath>("\"a/b\"")
                .unwrap()
                .as_str(),
            "a/b"
        );
    }
}
