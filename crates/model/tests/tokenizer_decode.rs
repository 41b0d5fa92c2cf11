//! Decoding invariants on real vocabularies: pieces put back together give the
//! text that was tokenized, and the streaming decoder never emits half a
//! character, whatever the token boundaries.

mod common;

use strata_model::tokenizer::Tokenizer;

const TEXTS: &[&str] = &[
    "Hello world, this is a test.",
    "emoji 😀👍🏽👨‍👩‍👧 and CJK 中文字 日本語 한국어",
    "code:\n\tfn main() { println!(\"{}\", 1 + 2); }\r\n",
    "mixed   spaces\u{a0}nbsp\u{3000}ideographic  \n\n end",
    "Ünïcödé ☃ € 𝄞 𐍈 \u{1F600}\u{FE0F}",
    "<|im_start|>user\nhi<|im_end|>",
];

fn tokenizers() -> Vec<(String, Tokenizer)> {
    let mut out = Vec::new();
    for name in [
        "gpt-2",
        "llama-bpe",
        "qwen2",
        "deepseek-llm",
        "falcon",
        "llama-spm",
        "phi-3",
    ] {
        let path = common::vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
        out.push((
            name.to_owned(),
            Tokenizer::from_gguf_file(path).expect("vocab"),
        ));
    }
    if let Some(p) = common::smollm2() {
        out.push((
            "smollm2".to_owned(),
            Tokenizer::from_gguf_file(p).expect("smollm2"),
        ));
    }
    out
}

#[test]
fn pieces_reassemble_the_text() {
    for (name, tok) in tokenizers() {
        for &text in TEXTS {
            // Raw tokenization: no BOS, special tokens left as text.
            let ids = tok.encode(text, false, false).expect("encode");
            let mut bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&id| tok.token_to_piece(id, 0, true).to_vec())
                .collect();
            if tok.kind() == strata_model::tokenizer::VocabKind::Spm && bytes.first() == Some(&b' ')
            {
                bytes.remove(0); // the space SentencePiece puts before the text
            }
            assert_eq!(String::from_utf8_lossy(&bytes), text, "{name}: {ids:?}");
        }
    }
}

#[test]
fn stream_decoder_emits_whole_characters() {
    for (name, tok) in tokenizers() {
        for &text in TEXTS {
            let ids = tok.encode(text, false, true).expect("encode");
            let whole: Vec<u8> = ids
                .iter()
                .flat_map(|&id| tok.token_to_piece(id, 0, true).to_vec())
                .collect();
            let mut dec = tok.stream_decoder(true);
            let mut streamed = String::new();
            let mut held_back = false;
            for &id in &ids {
                let chunk = dec.push(id);
                // A chunk is a String, so whole characters only; it never holds U+FFFD
                // here because every text above is valid UTF-8.
                assert!(
                    !chunk.contains('\u{FFFD}'),
                    "{name}: replacement char in {chunk:?}"
                );
                held_back |= chunk.len() < tok.token_to_piece(id, 0, true).len();
                streamed.push_str(&chunk);
            }
            streamed.push_str(&dec.finish());
            assert_eq!(streamed.as_bytes(), whole.as_slice(), "{name}");
            if text.contains('😀') && name != "llama-spm" && name != "phi-3" {
                assert!(held_back, "{name}: expected an emoji split across tokens");
            }
        }
    }
}

#[test]
fn stream_decoder_hides_control_tokens_unless_asked() {
    let tok = Tokenizer::from_gguf_file(common::vocab_dir().join("ggml-vocab-qwen2.gguf"))
        .expect("vocab");
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>", false, true)
        .expect("encode");
    let decode = |show: bool| {
        let mut d = tok.stream_decoder(show);
        let mut s: String = ids.iter().map(|&id| d.push(id)).collect();
        s.push_str(&d.finish());
        s
    };
    assert_eq!(decode(true), "<|im_start|>user\nhi<|im_end|>");
    assert_eq!(decode(false), "user\nhi");
    assert_eq!(tok.detokenize(&ids, false, false), "user\nhi");
}

#[test]
fn invalid_bytes_become_replacement_characters() {
    let tok = Tokenizer::from_gguf_file(common::vocab_dir().join("ggml-vocab-llama-spm.gguf"))
        .expect("vocab");
    let byte = |b: u8| tok.token_id(&format!("<0x{b:02X}>")).expect("byte token");
    let mut d = tok.stream_decoder(false);
    // 0xE2 0x82 then 'A': a truncated three-byte character, then a letter.
    assert_eq!(d.push(byte(0xE2)), "");
    assert_eq!(d.push(byte(0x82)), "");
    assert_eq!(d.push(byte(b'A')), "\u{FFFD}A");
    // A dangling lead byte at the end comes out as U+FFFD from finish().
    assert_eq!(d.push(byte(0xF0)), "");
    assert_eq!(d.finish(), "\u{FFFD}");
}
