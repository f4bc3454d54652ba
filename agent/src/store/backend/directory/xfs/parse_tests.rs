//! Tests of the output parsing, on text as the tools and the kernel print it.

use std::path::Path;

use super::*;

#[test]
fn the_mount_is_the_deepest_one_of_the_same_device() {
    let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 8:17 / /srv rw,relatime shared:5 - xfs /dev/sdb1 rw,attr2,inode64,prjquota
31 30 0:40 / /srv/export/tmp rw - tmpfs tmpfs rw
32 22 8:17 /export /mnt/nfs\\040export rw,relatime shared:5 - xfs /dev/sdb1 rw,prjquota
33 30 8:33 / /srv/export rw,relatime - xfs /dev/sdc1 rw,noquota
";
    let found = find_mount(mountinfo, Path::new("/srv/export/a"), 8, 17).unwrap();
    assert_eq!(found.mount_point, Path::new("/srv"));
    assert_eq!(
        (found.fstype.as_str(), found.source.as_str()),
        ("xfs", "/dev/sdb1")
    );

    // A bind mount with a space in its name.
    let found = find_mount(mountinfo, Path::new("/mnt/nfs export/v"), 8, 17).unwrap();
    assert_eq!(found.mount_point, Path::new("/mnt/nfs export"));

    // The filesystem mounted over /srv/export is found by its own device.
    let found = find_mount(mountinfo, Path::new("/srv/export"), 8, 33).unwrap();
    assert_eq!(found.mount_point, Path::new("/srv/export"));
    assert_eq!(found.source, "/dev/sdc1");

    // "/srvx" is not below "/srv".
    assert_eq!(find_mount(mountinfo, Path::new("/srvx"), 8, 17), None);

    // Mounted twice at the same place: the later mount is the visible one.
    let twice = "40 1 8:17 / /data rw - xfs /dev/old rw\n41 40 8:17 / /data rw - xfs /dev/new rw\n";
    assert_eq!(
        find_mount(twice, Path::new("/data/x"), 8, 17)
            .unwrap()
            .source,
        "/dev/new"
    );
}

#[test]
fn quota_lines_with_long_devices_and_running_timers_are_read() {
    // A device name longer than its column pushes the figures onto the next line; a
    // soft limit overrun shows a timer with spaces; a hard limit overrun "[--none--]".
    let output = "/dev/mapper/vg0-export--data\n                    \
                  5242884    4194304    5242880   00 [--none--]         12         10          0   00 [6 days 23:59:58] /srv/nfs export\n";
    assert_eq!(
        parse_quota_record(output),
        Some(Some(QuotaRecord {
            used_kib: 5_242_884,
            hard_kib: 5_242_880,
            used_inodes: 12,
        }))
    );
    assert_eq!(parse_quota_record("\n"), Some(None));
    assert_eq!(parse_quota_record("xfs_quota: cannot find mount"), None);
    assert_eq!(
        parse_quota_record("/dev/sdb1 12 0 100 00 [--------] 3 0 0 00 [--------]"),
        None,
        "the mount point is missing"
    );
}
