//! The IQ lookup tables (copied from llama.cpp's ggml-common.h) against the
//! `gguf` Python package's independent copies, recorded in
//! tests/golden/quant/iq_grids.json by tools/gen_iq_grid_golden.py.

use std::path::PathBuf;

use strata_quant::iq_tables::{
    IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS,
    KSIGNS_PM1, KSIGNS64, KVALUES_IQ4NL, KVALUES_MXFP4,
};

fn golden() -> serde_json::Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/quant/iq_grids.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("iq_grids.json parses")
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Checks a table given as rows of bytes against its golden record.
fn check(name: &str, rows: &[Vec<u8>]) {
    let g = golden();
    let t = &g["tables"][name];
    assert_eq!(
        t["count"].as_u64(),
        Some(rows.len() as u64),
        "{name}: entry count"
    );
    let width = t["entry_bytes"].as_u64().expect("entry_bytes") as usize;
    let samples = t["samples"].as_object().expect("samples");
    assert!(samples.len() >= 5, "{name}: too few samples");
    for (idx, want) in samples {
        let i: usize = idx.parse().expect("sample index");
        let want: Vec<u8> = want
            .as_array()
            .expect("sample")
            .iter()
            .map(|v| v.as_u64().expect("byte") as u8)
            .collect();
        assert_eq!(rows[i], want, "{name}[{i}] differs from gguf's");
    }
    let all: Vec<u8> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    assert_eq!(all.len(), rows.len() * width, "{name}: entry width");
    let want_hash = t["fnv1a64"].as_str().expect("fnv1a64");
    assert_eq!(
        format!("{:016x}", fnv1a64(&all)),
        want_hash,
        "{name}: some entry differs from gguf's"
    );
}

fn rows_u64(t: &[u64]) -> Vec<Vec<u8>> {
    t.iter().map(|v| v.to_le_bytes().to_vec()).collect()
}

fn rows_u32(t: &[u32]) -> Vec<Vec<u8>> {
    t.iter().map(|v| v.to_le_bytes().to_vec()).collect()
}

fn rows_i8(t: &[i8]) -> Vec<Vec<u8>> {
    t.iter().map(|&v| vec![v as u8]).collect()
}

#[test]
fn iq2_grids_match_gguf() {
    check("iq2xxs_grid", &rows_u64(&IQ2XXS_GRID));
    check("iq2xs_grid", &rows_u64(&IQ2XS_GRID));
    check("iq2s_grid", &rows_u64(&IQ2S_GRID));
}

#[test]
fn iq3_grids_match_gguf() {
    check("iq3xxs_grid", &rows_u32(&IQ3XXS_GRID));
    check("iq3s_grid", &rows_u32(&IQ3S_GRID));
}

#[test]
fn signs_and_levels_match_gguf() {
    check(
        "ksigns_iq2xs",
        &KSIGNS_IQ2XS.iter().map(|&b| vec![b]).collect::<Vec<_>>(),
    );
    check("kvalues_iq4nl", &rows_i8(&KVALUES_IQ4NL));
    check("kvalues_mxfp4", &rows_i8(&KVALUES_MXFP4));
}

/// The derived sign tables agree with the 7-bit → 8-bit sign table: bit 7 is
/// the parity of bits 0..7 (an even count of negatives), KSIGNS64 spreads
/// the bits to 0x00/0xff bytes and KSIGNS_PM1 to ±1 bytes.
#[test]
fn sign_tables_are_consistent() {
    assert_eq!(KMASK_IQ2XS, [1, 2, 4, 8, 16, 32, 64, 128]);
    for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
        assert_eq!(usize::from(s & 127), i);
        assert_eq!(
            s.count_ones() % 2,
            0,
            "ksigns[{i}] has an odd number of negatives"
        );
        for j in 0..8 {
            let neg = s & (1 << j) != 0;
            let b64 = (KSIGNS64[i] >> (8 * j)) as u8;
            let pm1 = (KSIGNS_PM1[i] >> (8 * j)) as u8 as i8;
            assert_eq!(b64, if neg { 0xff } else { 0 }, "ksigns64[{i}] byte {j}");
            assert_eq!(pm1, if neg { -1 } else { 1 }, "KSIGNS_PM1[{i}] byte {j}");
        }
    }
}
