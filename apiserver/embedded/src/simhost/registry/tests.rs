use super::*;
use crate::simhost::records::StateFile;
use battery_proto::flintlock::types::NetworkInterface;
use battery_proto::flintlock::types::micro_vm_status::MicroVmState;

fn iface(device_id: &str, kind: IfaceType, guest_mac: Option<&str>) -> NetworkInterface {
    NetworkInterface {
        device_id: device_id.to_owned(),
        r#type: kind.into(),
        guest_mac: guest_mac.map(str::to_owned),
        ..NetworkInterface::default()
    }
}

#[test]
fn random_macs_are_local_unicast() {
    let mac = random_mac();
    let octets: Vec<u8> = mac
        .split(':')
        .map(|octet| u8::from_str_radix(octet, 16).expect("hex octet"))
        .collect();
    assert_eq!(octets.len(), 6);
    assert_eq!(
        octets[0] & 0b11,
        0b10,
        "locally administered, unicast: {mac}"
    );
}

#[test]
fn interfaces_get_distinct_host_devices() {
    let mut vms = Vms {
        by_uid: BTreeMap::new(),
        next_interface_index: FIRST_INTERFACE_INDEX,
    };
    let spec = MicroVmSpec {
        interfaces: vec![
            iface("eth0", IfaceType::Tap, None),
            iface("eth1", IfaceType::Macvtap, Some("aa:bb:cc:dd:ee:ff")),
        ],
        ..MicroVmSpec::default()
    };
    let interfaces = vms.allocate_interfaces(&spec).expect("allocated");
    assert_eq!(interfaces["eth0"].host_device_name, "tap2");
    assert_eq!(interfaces["eth0"].index, 2);
    assert_eq!(interfaces["eth1"].host_device_name, "macvtap3");
    assert_eq!(interfaces["eth1"].mac_address, "aa:bb:cc:dd:ee:ff");
    assert_eq!(vms.next_interface_index, 4);
}

#[test]
fn interface_validation() {
    let duplicate = MicroVmSpec {
        interfaces: vec![
            iface("eth0", IfaceType::Tap, None),
            iface("eth0", IfaceType::Tap, None),
        ],
        ..MicroVmSpec::default()
    };
    assert!(matches!(
        validate_interfaces(&duplicate),
        Err(RequestError::DuplicateDeviceId(device)) if device == "eth0"
    ));
    let unnamed = MicroVmSpec {
        interfaces: vec![iface("", IfaceType::Tap, None)],
        ..MicroVmSpec::default()
    };
    assert!(matches!(
        validate_interfaces(&unnamed),
        Err(RequestError::DeviceIdRequired { position: 0 })
    ));
}

#[test]
fn unknown_interface_type_is_refused() {
    let mut vms = Vms {
        by_uid: BTreeMap::new(),
        next_interface_index: FIRST_INTERFACE_INDEX,
    };
    let mut bad = iface("eth0", IfaceType::Tap, None);
    bad.r#type = 7;
    let spec = MicroVmSpec {
        interfaces: vec![bad],
        ..MicroVmSpec::default()
    };
    assert!(matches!(
        vms.allocate_interfaces(&spec),
        Err(RequestError::UnknownInterfaceType { value: 7, .. })
    ));
    assert_eq!(vms.next_interface_index, FIRST_INTERFACE_INDEX);
}

#[tokio::test]
async fn a_list_of_an_earlier_version_moves_to_records() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = MicroVmSpec {
        id: "vm".into(),
        namespace: "ns".into(),
        ..MicroVmSpec::default()
    };
    let stored = |uid: &str, state, index| StoredMicroVm {
        uid: uid.into(),
        state,
        version: 2,
        spec: spec.encode_to_vec(),
        network_interfaces: [(
            "eth0".to_owned(),
            StoredInterface {
                host_device_name: format!("tap{index}"),
                index,
                mac_address: "02:00:00:00:00:01".into(),
            },
        )]
        .into(),
    };
    let legacy = StateFile {
        microvms: vec![
            stored("created", VmState::Created, 2),
            stored("pending", VmState::Pending, 3),
        ],
    };
    let legacy_path = dir.path().join(LEGACY_STATE_FILE);
    std::fs::write(&legacy_path, serde_json::to_vec(&legacy).expect("encoded")).expect("written");

    let (registry, pending) = Registry::open(dir.path(), CancellationToken::new())
        .await
        .expect("opened");
    assert_eq!(registry.uids(), ["created", "pending"]);
    let pending: Vec<&str> = pending.iter().map(|(uid, _)| uid.as_str()).collect();
    assert_eq!(pending, ["pending"]);
    assert!(!legacy_path.exists(), "the list is replaced by records");
    assert!(registry.record("created").is_file());
    assert!(registry.record("pending").is_file());
    drop(registry);

    // Opened again from the records alone: the same MicroVMs, and new interfaces
    // after theirs.
    let (registry, _) = Registry::open(dir.path(), CancellationToken::new())
        .await
        .expect("reopened");
    assert_eq!(registry.uids(), ["created", "pending"]);
    let created = registry.get("created").expect("created");
    assert_eq!(created.spec, Some(spec.clone()));
    let status = created.status.expect("status");
    assert_eq!(status.state, i32::from(MicroVmState::Created));
    assert_eq!(status.network_interfaces["eth0"].host_device_name, "tap2");
    assert_eq!(registry.lock().next_interface_index, 4);
}

#[tokio::test]
async fn a_record_follows_its_microvm_and_an_unfinished_write_is_dropped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (registry, _) = Registry::open(dir.path(), CancellationToken::new())
        .await
        .expect("opened");
    let created = registry
        .create(MicroVmSpec {
            id: "vm".into(),
            namespace: "ns".into(),
            ..MicroVmSpec::default()
        })
        .await
        .expect("created");
    let record = registry.record(&created.uid);
    let read = || {
        serde_json::from_slice::<StoredMicroVm>(&std::fs::read(&record).expect("record"))
            .expect("parsed")
    };
    assert_eq!(read().state, VmState::Pending);
    registry.finish_boot(&created.uid, VmState::Created).await;
    assert_eq!(read().state, VmState::Created);
    assert_eq!(read().version, 2);
    registry.delete(&created.uid).await.expect("deleted");
    assert!(!record.exists());
    drop(registry);

    // As a crash in the middle of a write leaves one.
    let unfinished = dir.path().join(RECORDS).join("cut.json.tmp");
    std::fs::write(&unfinished, "{").expect("written");
    let (registry, _) = Registry::open(dir.path(), CancellationToken::new())
        .await
        .expect("reopened");
    assert!(registry.uids().is_empty());
    assert!(!unfinished.exists());
}

#[test]
fn state_file_round_trips() {
    let spec = MicroVmSpec {
        id: "vm".into(),
        namespace: "ns".into(),
        vcpu: 2,
        ..MicroVmSpec::default()
    };
    let file = StateFile {
        microvms: vec![StoredMicroVm {
            uid: "u".into(),
            state: VmState::Created,
            version: 2,
            spec: spec.encode_to_vec(),
            network_interfaces: BTreeMap::new(),
        }],
    };
    let json = serde_json::to_string(&file).expect("encoded");
    assert!(json.contains(r#""state":"CREATED""#), "{json}");
    let back: StateFile = serde_json::from_str(&json).expect("decoded");
    let decoded = MicroVmSpec::decode(back.microvms[0].spec.as_slice()).expect("spec");
    assert_eq!(decoded, spec);
}
