//! `colibri lnet` input: configuration files (YAML) never panic, and what
//! is read is written back and read again the same; control requests
//! (JSON) never panic.
#![no_main]

use colibri_lnet_rt::conf::NodeConf;
use colibri_lnet_rt::ctl::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok((conf, _)) = NodeConf::from_yaml(text) {
            let (again, _) = NodeConf::from_yaml(&conf.to_yaml()).expect("re-read export");
            assert_eq!(again, conf);
        }
    }
    let _ = serde_json::from_slice::<Request>(data);
});
