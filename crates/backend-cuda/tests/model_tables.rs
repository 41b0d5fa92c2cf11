//! The lattice and value tables the CUDA kernels dequantise with (kernels-cuda/
//! quant_tables.cuh, generated from llama.cpp's ggml-common.h by
//! tools/gen_cuda_quant_tables.py) equal strata-quant's, entry for entry. Runs without a GPU.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_quant::iq_tables as t;

const HEADER: &str = include_str!("../../../kernels-cuda/quant_tables.cuh");

/// The entries of `static __device__ const TYPE name[N] = { ... };` as integers.
fn table(name: &str) -> Vec<i128> {
    let start = HEADER
        .find(&format!(" {name}["))
        .unwrap_or_else(|| panic!("{name} not in quant_tables.cuh"));
    let body = &HEADER[start..];
    let open = body.find('{').unwrap();
    let close = body.find("};").unwrap();
    body[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.strip_prefix("0x") {
            Some(hex) => i128::from_str_radix(hex, 16).unwrap(),
            None => s.parse().unwrap(),
        })
        .collect()
}

/// The `#define NAME_Wi 0x...u` words of a 16-entry byte table.
fn words(name: &str) -> Vec<u32> {
    (0..4)
        .map(|i| {
            let key = format!("#define {}_W{i} 0x", name.to_uppercase());
            let at = HEADER.find(&key).unwrap_or_else(|| panic!("{key} missing")) + key.len();
            u32::from_str_radix(&HEADER[at..at + 8], 16).unwrap()
        })
        .collect()
}

fn check<T: Copy + Into<i128>>(name: &str, want: &[T]) {
    let got = table(name);
    let want: Vec<i128> = want.iter().map(|&v| v.into()).collect();
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{name}[{i}]");
    }
}

#[test]
fn cuda_tables_equal_the_quant_crates() {
    check("ksigns_iq2xs", &t::KSIGNS_IQ2XS);
    check("iq2xxs_grid", &t::IQ2XXS_GRID);
    check("iq2xs_grid", &t::IQ2XS_GRID);
    check("iq2s_grid", &t::IQ2S_GRID);
    check("iq3xxs_grid", &t::IQ3XXS_GRID);
    check("iq3s_grid", &t::IQ3S_GRID);
    check("kvalues_iq4nl", &t::KVALUES_IQ4NL);
    check("kvalues_mxfp4", &t::KVALUES_MXFP4);
    for (name, values) in [
        ("kvalues_iq4nl", &t::KVALUES_IQ4NL),
        ("kvalues_mxfp4", &t::KVALUES_MXFP4),
    ] {
        let bytes: Vec<u8> = values.iter().map(|&v| v as u8).collect();
        let want: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(words(name), want, "{name} words");
    }
}
