//! nfs-ganesha's NFSv4 file handle as FSAL VFS makes it, to take apart and forge:
//!
//! ```text
//! file_handle_v4:  fhversion (0x43) | fhflags1 | export id (u16, big-endian) | fs_len | FSAL part
//! VFS FSAL part:   flags | fsid (0, 8 or 16 bytes) | kernel handle type (1, 2 or 4 bytes,
//!                  host order) | kernel handle (name_to_handle_at's f_handle)
//! flags:           bits 0-4 fsid type, bit 5 dummy, bits 6-7 size of the handle type
//! ```
//!
//! The server checks that the handle's fsid names a filesystem the export serves, and
//! opens the kernel handle on it: nothing ties the object to the export's path.

use thiserror::Error;

pub const GANESHA_FH_VERSION: u8 = 0x43;
const TYPE_SIZE_MASK: u8 = 0xC0;
const TYPE_8: u8 = 0x40;
const TYPE_16: u8 = 0x80;
const TYPE_32: u8 = 0xC0;
const FSID_TYPE_MASK: u8 = 0x1F;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HandleError {
    #[error("not a ganesha v4 handle: {0}")]
    NotGanesha(String),
    #[error("not a VFS handle: {0}")]
    NotVfs(String),
}

/// A kernel file handle: `name_to_handle_at`'s type and bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelHandle {
    pub handle_type: i32,
    pub bytes: Vec<u8>,
}

impl KernelHandle {
    /// The handle of a directory by inode and generation as ext4 and XFS (32-bit inode
    /// numbers) give it: `FILEID_INO32_GEN`. A filesystem's root is inode 2 on ext4,
    /// 128 on XFS, generation 0: known without asking anyone.
    pub fn ino32_gen(inode: u32, generation: u32) -> Self {
        let mut bytes = inode.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&generation.to_ne_bytes());
        Self {
            handle_type: 1,
            bytes,
        }
    }
}

/// A ganesha NFSv4 handle, taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaneshaHandle {
    pub flags: u8,
    pub export_id: u16,
    pub fsal: VfsHandle,
}

/// The FSAL VFS part of a handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfsHandle {
    /// The fsid type (ganesha's `enum fsid_type`) and dummy bit: the flags byte without
    /// the size of the handle type, which follows from the type itself.
    pub fsid_type: u8,
    pub fsid: Vec<u8>,
    pub kernel: KernelHandle,
}

impl GaneshaHandle {
    pub fn parse(wire: &[u8]) -> Result<Self, HandleError> {
        let [version, flags, id_hi, id_lo, fs_len, rest @ ..] = wire else {
            return Err(HandleError::NotGanesha(format!("{} bytes", wire.len())));
        };
        if *version != GANESHA_FH_VERSION {
            return Err(HandleError::NotGanesha(format!("version {version:#x}")));
        }
        let fsal = rest
            .get(..usize::from(*fs_len))
            .ok_or_else(|| HandleError::NotGanesha(format!("fs_len {fs_len} > {}", rest.len())))?;
        Ok(Self {
            flags: *flags,
            export_id: u16::from_be_bytes([*id_hi, *id_lo]),
            fsal: VfsHandle::parse(fsal)?,
        })
    }

    pub fn compose(&self) -> Vec<u8> {
        let fsal = self.fsal.compose();
        let mut wire = vec![GANESHA_FH_VERSION, self.flags];
        wire.extend_from_slice(&self.export_id.to_be_bytes());
        wire.push(fsal.len() as u8);
        wire.extend_from_slice(&fsal);
        wire
    }

    /// This handle with export id `export_id` in place of its own.
    #[must_use]
    pub fn with_export_id(&self, export_id: u16) -> Self {
        Self {
            export_id,
            ..self.clone()
        }
    }

    /// This handle with `kernel` in place of its kernel handle: same export, same fsid.
    #[must_use]
    pub fn with_kernel(&self, kernel: KernelHandle) -> Self {
        let mut forged = self.clone();
        forged.fsal.kernel = kernel;
        forged
    }
}

impl VfsHandle {
    pub fn parse(fsal: &[u8]) -> Result<Self, HandleError> {
        let [flags, rest @ ..] = fsal else {
            return Err(HandleError::NotVfs("empty".into()));
        };
        let fsid_type = flags & !TYPE_SIZE_MASK;
        let fsid_len = match fsid_type & FSID_TYPE_MASK {
            0 => 0,
            1 | 2 | 4 | 5 => 8,
            3 => 16,
            other => return Err(HandleError::NotVfs(format!("fsid type {other}"))),
        };
        let type_len = match flags & TYPE_SIZE_MASK {
            TYPE_8 => 1,
            TYPE_16 => 2,
            TYPE_32 => 4,
            _ => {
                return Err(HandleError::NotVfs(format!(
                    "flags {flags:#x}: no handle type"
                )));
            }
        };
        if rest.len() < fsid_len + type_len {
            return Err(HandleError::NotVfs(format!("{} bytes", fsal.len())));
        }
        let (fsid, rest) = rest.split_at(fsid_len);
        let (raw_type, bytes) = rest.split_at(type_len);
        let handle_type = match raw_type {
            [t] => i32::from(*t),
            [a, b] => i32::from(i16::from_ne_bytes([*a, *b])),
            [a, b, c, d] => i32::from_ne_bytes([*a, *b, *c, *d]),
            _ => unreachable!("type_len is 1, 2 or 4"),
        };
        Ok(Self {
            fsid_type,
            fsid: fsid.to_vec(),
            kernel: KernelHandle {
                handle_type,
                bytes: bytes.to_vec(),
            },
        })
    }

    /// Encodes the handle type as ganesha does: in one byte if it fits, else two, else four.
    pub fn compose(&self) -> Vec<u8> {
        let handle_type = self.kernel.handle_type;
        let (size, raw): (u8, Vec<u8>) = if (0..=255).contains(&handle_type) {
            (TYPE_8, vec![handle_type as u8])
        } else if let Ok(short) = i16::try_from(handle_type) {
            (TYPE_16, short.to_ne_bytes().to_vec())
        } else {
            (TYPE_32, handle_type.to_ne_bytes().to_vec())
        };
        let mut fsal = vec![self.fsid_type | size];
        fsal.extend_from_slice(&self.fsid);
        fsal.extend_from_slice(&raw);
        fsal.extend_from_slice(&self.kernel.bytes);
        fsal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_parses_and_composes_back_to_the_same_bytes() {
        // Export 7, fsid type 4 (two u32), kernel type 1, ext4 inode 12 generation 5.
        let mut wire = vec![0x43, 0, 0, 7, 18, 0x44];
        wire.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        wire.push(1);
        wire.extend_from_slice(&KernelHandle::ino32_gen(12, 5).bytes);
        let handle = GaneshaHandle::parse(&wire).unwrap();
        assert_eq!(handle.export_id, 7);
        assert_eq!(handle.fsal.fsid, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(handle.fsal.kernel, KernelHandle::ino32_gen(12, 5));
        assert_eq!(handle.compose(), wire);
    }

    #[test]
    fn forging_keeps_the_export_id_and_swaps_the_kernel_handle() {
        let handle = GaneshaHandle {
            flags: 0,
            export_id: 3,
            fsal: VfsHandle {
                fsid_type: 4,
                fsid: vec![9; 8],
                kernel: KernelHandle::ino32_gen(40, 1),
            },
        };
        let forged = handle.with_kernel(KernelHandle::ino32_gen(2, 0));
        let parsed = GaneshaHandle::parse(&forged.compose()).unwrap();
        assert_eq!(parsed.export_id, 3);
        assert_eq!(parsed.fsal.fsid, vec![9; 8]);
        assert_eq!(parsed.fsal.kernel, KernelHandle::ino32_gen(2, 0));
        let big = KernelHandle {
            handle_type: 0x4d,
            bytes: vec![1; 40],
        };
        let big_type = handle.with_kernel(KernelHandle {
            handle_type: 300,
            ..big
        });
        assert_eq!(GaneshaHandle::parse(&big_type.compose()).unwrap(), big_type);
    }

    #[test]
    fn a_knfsd_handle_or_a_short_one_is_refused() {
        assert!(matches!(
            GaneshaHandle::parse(&[1, 0, 0, 1, 0]),
            Err(HandleError::NotGanesha(_))
        ));
        assert!(GaneshaHandle::parse(&[0x43, 0, 0, 1, 9, 0x44]).is_err());
    }
}
