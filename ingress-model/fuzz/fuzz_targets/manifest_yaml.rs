#![no_main]
//! YAML loading never panics; whatever loads can be validated, written back and reloaded.
libfuzzer_sys::fuzz_target!(|s: &str| {
    if let Ok(ingresses) = meshkit_ingress_model::manifest::from_yaml_str(s) {
        ingresses
            .iter()
            .for_each(|i| drop(meshkit_ingress_model::validation::validate_ingress(i)));
        if let Ok(yaml) = meshkit_ingress_model::manifest::to_yaml_string(&ingresses) {
            assert_eq!(
                meshkit_ingress_model::manifest::from_yaml_str(&yaml).ok(),
                Some(ingresses)
            );
        }
    }
});
