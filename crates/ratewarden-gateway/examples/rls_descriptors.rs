//! Writes `src/front/rls/rls_descriptors.bin`: the descriptors of Envoy's
//! `rls.proto` and every file it imports, taken from envoy-types' own
//! descriptor set, for server reflection.
//!
//!     cargo run -p ratewarden-gateway --example rls_descriptors -- \
//!         ~/.cargo/registry/src/*/envoy-types-0.7.7/src/generated/types.bin
//!
//! (Source code info is dropped: 41 KB instead of 253 KB.)

use std::collections::{BTreeSet, HashMap};

use prost::Message;

fn main() {
    let Some(from) = std::env::args().nth(1) else {
        eprintln!("usage: rls_descriptors PATH/TO/envoy-types/src/generated/types.bin");
        std::process::exit(2);
    };
    let bytes = std::fs::read(&from).unwrap_or_else(|e| panic!("{from}: {e}"));
    let set = prost_types::FileDescriptorSet::decode(&bytes[..]).expect("a FileDescriptorSet");
    let by_name: HashMap<&str, &prost_types::FileDescriptorProto> =
        set.file.iter().map(|f| (f.name(), f)).collect();
    let mut wanted = vec!["envoy/service/ratelimit/v3/rls.proto"];
    let mut kept = BTreeSet::new();
    while let Some(name) = wanted.pop() {
        if kept.insert(name) {
            let f = by_name
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not in {from}"));
            wanted.extend(f.dependency.iter().map(String::as_str));
        }
    }
    // In the set's order: a file's imports come before it.
    let file = set
        .file
        .iter()
        .filter(|f| kept.contains(f.name()))
        .map(|f| prost_types::FileDescriptorProto {
            source_code_info: None,
            ..f.clone()
        })
        .collect();
    let out = prost_types::FileDescriptorSet { file }.encode_to_vec();
    let to = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/front/rls/rls_descriptors.bin"
    );
    std::fs::write(to, &out).unwrap_or_else(|e| panic!("{to}: {e}"));
    eprintln!("{to}: {} files, {} bytes", kept.len(), out.len());
}
