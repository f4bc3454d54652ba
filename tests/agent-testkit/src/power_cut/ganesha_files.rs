//! The ganesha manager's files as ganesha would load them at boot, read by the check
//! itself: `exports.conf` and the EXPORT block of each file it `%include`s, in ganesha's
//! configuration syntax (`KEY = VALUE, VALUE;`, nested `NAME { ... }` blocks, `#`
//! comments). Nothing of the agent's own reading is used.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};

/// The file of the manager's directory that ganesha's configuration includes.
pub const INCLUDE_FILE: &str = "exports.conf";

/// One EXPORT block, the values the check compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportBlock {
    pub id: u16,
    pub path: String,
    pub pseudo: String,
    /// The export's own `Access_Type`: who may mount beyond its CLIENT blocks.
    pub access: String,
    pub squash: String,
    pub anon_uid: Option<u32>,
    pub anon_gid: Option<u32>,
    pub sec: Vec<String>,
    pub fsal: String,
    /// The clients of its CLIENT blocks, with their `Access_Type`.
    pub clients: BTreeMap<String, String>,
}

/// What the copy's directory holds: the EXPORT blocks `exports.conf` includes, by the
/// path each exports, and the names of the directory's entries.
#[derive(Debug)]
pub struct GaneshaFiles {
    pub blocks: BTreeMap<String, ExportBlock>,
    pub entries: BTreeSet<String>,
}

impl GaneshaFiles {
    /// Reads `dir` (the copy's directory), whose files name `original` (the directory as
    /// the acknowledging agent had it) in their `%include`s.
    pub fn read(dir: &Path, original: &Path) -> anyhow::Result<Self> {
        let mut blocks = BTreeMap::new();
        let mut ids = BTreeSet::new();
        let mut included = BTreeSet::new();
        let mut lists = BTreeSet::new();
        // `exports.conf` includes the lists of the buckets of ids, each of which includes
        // its blocks: followed level by level, as ganesha's parser does.
        let mut pending = vec![PathBuf::from(INCLUDE_FILE)];
        while let Some(list) = pending.pop() {
            let shown_list = list.display().to_string();
            let text = std::fs::read_to_string(dir.join(&list))
                .with_context(|| format!("{shown_list} is not on the copy"))?;
            lists.insert(list.clone());
            for name in include_lines(&text, original, &shown_list)? {
                ensure!(
                    included.insert(name.clone()),
                    "{} is included twice",
                    name.display()
                );
                let named = name.display();
                let file_text = std::fs::read_to_string(dir.join(&name))
                    .with_context(|| format!("{shown_list} includes {named}, which is missing"))?;
                if is_list(&file_text) {
                    pending.push(name);
                    continue;
                }
                let block = ExportBlock::parse(&file_text)
                    .with_context(|| format!("the block of {named}"))?;
                ensure!(
                    ids.insert(block.id),
                    "Export_Id {} is given twice",
                    block.id
                );
                if let Some(other) = blocks.insert(block.path.clone(), block) {
                    bail!("{} is exported twice", other.path);
                }
            }
        }
        let entries = std::fs::read_dir(dir)?
            .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<BTreeSet<String>>>()?;
        // Every block file is included: one left beside the include lists would be
        // loaded by nothing at boot, but by the agent's start as a record.
        let block_files: BTreeSet<PathBuf> = entries
            .iter()
            .filter(|name| name.ends_with(".conf") && !name.starts_with('.'))
            .map(PathBuf::from)
            .filter(|name| !lists.contains(name))
            .collect();
        let not_included: Vec<_> = block_files.difference(&included).collect();
        ensure!(
            not_included.is_empty(),
            "the directory holds block files no include list names: {not_included:?}"
        );
        Ok(Self { blocks, entries })
    }

    /// Staged files (hidden names) left in the directory: after an acknowledged change
    /// each was made current or removed.
    pub fn leftovers(&self) -> Vec<&String> {
        self.entries
            .iter()
            .filter(|name| name.starts_with('.'))
            .collect()
    }
}

/// The files a list `%include`s, each a name in the directory (`original` as the
/// acknowledging agent named it).
fn include_lines(text: &str, original: &Path, list: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let named = line
            .strip_prefix("%include")
            .map(str::trim)
            .and_then(|rest| rest.strip_prefix('"'))
            .and_then(|rest| rest.strip_suffix('"'))
            .with_context(|| {
                let shown: String = line.chars().take(80).collect();
                format!("{list} has a line that is no %include: {shown:?}")
            })?;
        let name = Path::new(named)
            .strip_prefix(original)
            .ok()
            .filter(|name| name.components().count() == 1)
            .with_context(|| format!("{list} includes {named}, outside its directory"))?;
        names.push(name.to_owned());
    }
    Ok(names)
}

/// Whether a file is an include list (only `%include` lines and comments) rather than a
/// block.
fn is_list(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .all(|line| line.starts_with("%include"))
}

impl ExportBlock {
    /// The one EXPORT block of a file.
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut tokens = tokens(text)?.into_iter().peekable();
        let mut blocks = Vec::new();
        while tokens.peek().is_some() {
            blocks.push(Block::parse(&mut tokens)?);
        }
        let [export] = blocks.as_slice() else {
            bail!("{} blocks where one EXPORT is expected", blocks.len());
        };
        ensure!(
            export.name.eq_ignore_ascii_case("EXPORT"),
            "a {} block",
            export.name
        );
        let mut clients = BTreeMap::new();
        for client in export.blocks("CLIENT") {
            let access = client.one("Access_Type")?.to_owned();
            for name in client.all("Clients") {
                ensure!(
                    clients.insert(name.clone(), access.clone()).is_none(),
                    "client {name} is given twice"
                );
            }
        }
        let fsal = match export.blocks("FSAL").as_slice() {
            [fsal] => fsal.one("Name")?.to_owned(),
            other => bail!("{} FSAL blocks", other.len()),
        };
        Ok(Self {
            id: export.one("Export_Id")?.parse()?,
            path: export.one("Path")?.to_owned(),
            pseudo: export.one("Pseudo")?.to_owned(),
            access: export.one("Access_Type")?.to_owned(),
            squash: export.one("Squash")?.to_owned(),
            anon_uid: export
                .optional("Anonymous_Uid")?
                .map(str::parse)
                .transpose()?,
            anon_gid: export
                .optional("Anonymous_Gid")?
                .map(str::parse)
                .transpose()?,
            sec: export.all("SecType").to_vec(),
            fsal,
            clients,
        })
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Open,
    Close,
    Equals,
    Comma,
    Semicolon,
    Word(String),
}

fn tokens(text: &str) -> anyhow::Result<Vec<Token>> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            c if c.is_whitespace() => {}
            '{' => tokens.push(Token::Open),
            '}' => tokens.push(Token::Close),
            '=' => tokens.push(Token::Equals),
            ',' => tokens.push(Token::Comma),
            ';' => tokens.push(Token::Semicolon),
            '"' => {
                let mut word = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some(c) => word.push(c),
                        None => bail!("a quoted value runs to the end of the file"),
                    }
                }
                tokens.push(Token::Word(word));
            }
            c => {
                let mut word = String::from(c);
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || "{}=,;\"#".contains(next) {
                        break;
                    }
                    word.push(next);
                    chars.next();
                }
                tokens.push(Token::Word(word));
            }
        }
    }
    Ok(tokens)
}

/// A `NAME { ... }` block: its parameters and the blocks inside it.
struct Block {
    name: String,
    params: Vec<(String, Vec<String>)>,
    inner: Vec<Block>,
}

type Tokens = std::iter::Peekable<std::vec::IntoIter<Token>>;

impl Block {
    fn parse(tokens: &mut Tokens) -> anyhow::Result<Self> {
        let Some(Token::Word(name)) = tokens.next() else {
            bail!("a block without a name");
        };
        ensure!(tokens.next() == Some(Token::Open), "{name} without its {{");
        Self::body(name, tokens)
    }

    fn body(name: String, tokens: &mut Tokens) -> anyhow::Result<Self> {
        let mut block = Block {
            name,
            params: Vec::new(),
            inner: Vec::new(),
        };
        loop {
            match tokens.next() {
                Some(Token::Close) => return Ok(block),
                Some(Token::Word(key)) => match tokens.next() {
                    Some(Token::Open) => block.inner.push(Self::body(key, tokens)?),
                    Some(Token::Equals) => {
                        let mut values = Vec::new();
                        loop {
                            match tokens.next() {
                                Some(Token::Word(value)) => values.push(value),
                                other => bail!("{key} = followed by {other:?}"),
                            }
                            match tokens.next() {
                                Some(Token::Comma) => {}
                                Some(Token::Semicolon) => break,
                                other => bail!("{key}'s values followed by {other:?}"),
                            }
                        }
                        block.params.push((key, values));
                    }
                    other => bail!("{key} followed by {other:?}"),
                },
                other => bail!("{} holds {other:?}", block.name),
            }
        }
    }

    /// The values of `key` (ganesha's keys are case-insensitive), empty if it is absent.
    fn all(&self, key: &str) -> &[String] {
        self.params
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map_or(&[], |(_, values)| values.as_slice())
    }

    fn optional(&self, key: &str) -> anyhow::Result<Option<&str>> {
        let found: Vec<_> = self
            .params
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(key))
            .collect();
        match found.as_slice() {
            [] => Ok(None),
            [(_, values)] if values.len() == 1 => Ok(Some(&values[0])),
            _ => bail!("{} has {key} more than once", self.name),
        }
    }

    fn one(&self, key: &str) -> anyhow::Result<&str> {
        self.optional(key)?
            .with_context(|| format!("{} has no {key}", self.name))
    }

    fn blocks(&self, name: &str) -> Vec<&Block> {
        self.inner
            .iter()
            .filter(|block| block.name.eq_ignore_ascii_case(name))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_read_with_its_clients_and_comments_skipped() {
        let text = "# nfsprov-record {\"x\": 1}\nEXPORT {\n  Export_Id = 1001;\n  \
                    Path = \"/srv/a\";\n  Pseudo = \"/srv/a\";\n  Access_Type = None;\n  \
                    Squash = All_Squash;\n  Anonymous_Uid = 2000;\n  SecType = sys, krb5;\n  \
                    FSAL { Name = VFS; }\n  CLIENT {\n    Clients = 10.0.0.0/8, fd00::/64;\n    \
                    Access_Type = RO;\n  }\n}\n";
        let block = ExportBlock::parse(text).unwrap();
        assert_eq!(block.id, 1001);
        assert_eq!(block.path, "/srv/a");
        assert_eq!(block.squash, "All_Squash");
        assert_eq!(block.anon_uid, Some(2000));
        assert_eq!(block.anon_gid, None);
        assert_eq!(block.sec, ["sys", "krb5"]);
        assert_eq!(block.fsal, "VFS");
        assert_eq!(
            block.clients.keys().collect::<Vec<_>>(),
            ["10.0.0.0/8", "fd00::/64"]
        );
        assert!(block.clients.values().all(|access| access == "RO"));
    }

    #[test]
    fn a_torn_block_is_refused() {
        let text = "EXPORT {\n  Export_Id = 1001;\n  Path = \"/srv/a\";\n  Pseu";
        assert!(ExportBlock::parse(text).is_err());
        assert!(ExportBlock::parse("\0\0\0\0").is_err());
        assert!(ExportBlock::parse("").is_err());
    }
}
