//! The pre-tokenizer of every supported `tokenizer.ggml.pre` value: the regexes
//! llama.cpp applies in cascade (src/llama-vocab.cpp, `llm_tokenizer_bpe`) and the
//! per-name flags it sets when loading the vocabulary. These are format facts,
//! carried over exactly.

/// One pre-tokenizer: regexes applied one after the other, each to every piece
/// the previous ones produced (matches and the text between them alike).
pub(crate) type RegexList = &'static [&'static str];

const GPT2: RegexList =
    &[r##"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"##];

const DEFAULT: RegexList = &[
    r##"[\p{P}\$\+<=>\^~\|]+"##,
    r##"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"##,
    r##"\p{N}+"##,
    r##"[0-9][0-9][0-9]"##,
];

const LLAMA3: RegexList = &[
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const JAIS2: RegexList = &[
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"##,
];

const DEEPSEEK_LLM: RegexList = &[
    r##"[\r\n]"##,
    r##"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+"##,
    r##"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+"##,
    r##"\s+$"##,
    r##"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"##,
    r##"\p{N}+"##,
];

const DEEPSEEK3: RegexList = &[
    r##"\p{N}{1,3}"##,
    r##"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+"##,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const SPARK2_5: RegexList = &[
    r##"\p{N}{1,3}"##,
    r##"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+"##,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
    r##"\p{N}"##,
];

// llama.cpp matches \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm} and \p{Lo} all as \p{L} (its
// category collapse has one class for letters), so they are written \p{L} here.
const YOUTU: RegexList = &[
    r##"[\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+"##,
    r##"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]*[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+[\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const DEEPSEEK_CODER: RegexList = &[
    r##"[\r\n]"##,
    r##"\s?\p{L}+"##,
    r##"\s?\p{P}+"##,
    r##"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"##,
    r##"\p{N}"##,
];

const FALCON: RegexList = &[
    r##"[\p{P}\$\+<=>\^~\|`]+"##,
    r##"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"##,
    r##"[0-9][0-9][0-9]"##,
];

const STARCODER: RegexList = &[
    r##"\p{N}"##,
    r##"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"##,
];

const QWEN2: RegexList = &[
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const QWEN35: RegexList = &[
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const PORO: RegexList =
    &[r##" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"##];

const CHATGLM4: RegexList = LLAMA3;

const VIKING: RegexList = &[
    r##" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"##,
    r##"\p{N}"##,
];

const TEKKEN: RegexList = &[
    r##"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const CHAMELEON: RegexList = &[
    r##"<sentinel:[0-9]+>"##,
    r##"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"##,
    r##"([\t\n]|    |  )"##,
    r##"\p{N}"##,
    r##"[\p{P}!-/:-@\[-`{-~]"##,
    r##"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"##,
];

const GPT4O: RegexList = &[
    r##"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const GRANITE_EMB_MULTI: RegexList = &[
    r##"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const BAILINGMOE: RegexList = &[
    r##"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"##,
];

const SEED_CODER: RegexList = &[
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const UFAKZEKA: RegexList =
    &[r##"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##];

const LAGUNA: RegexList = &[
    r##"[^\n]+|[\n]+"##,
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const EXAONE_MOE: RegexList = &[
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"##,
];

/// llama.cpp's name for its digit-grouping splitter (not a regex): each run of
/// digits is cut into groups of three from the right.
pub(crate) const AFMOE_DIGITS: &str = r"\p{AFMoE_digits}";

const AFMOE: RegexList = &[
    AFMOE_DIGITS,
    // The range from U+8C48 is as in llama.cpp's source.
    r##"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{8C48}-\x{FAFF}\x{3040}-\x{309F}\x{30A0}-\x{30FF}\x{FF65}-\x{FF9F}\x{2F00}-\x{2FDF}\x{E40}-\x{E7F}\x{E80}-\x{EFF}\x{1780}-\x{17FF}\x{1000}-\x{109F}\x{AA60}-\x{AA7F}\x{A9E0}-\x{A9FF}\x{AC00}-\x{D7AF}\x{1100}-\x{11FF}]+"##,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

// The first step is llama.cpp's digit splitter (it stands in for the original
// `\d{1,3}(?=(?:\d{3})*\b)`); \p{Lu} etc. are written \p{L} as for youtu.
const TINY_AYA: RegexList = &[
    AFMOE_DIGITS,
    r##"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]*[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+[\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

// llama.cpp's hand-written Kimi-K2 splitter as one regex: Han runs (its Han
// ranges), letter runs without Han (letters only, case ignored, as its splitter
// does), then the llama3-style rest.
const KIMI_K2: RegexList = &[
    r##"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{2CEB0}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]+|[^\r\n\p{L}\p{N}]?[\p{L}--[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{2CEB0}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

// std::regex's \d is ASCII, hence [0-9]; the second regex only matches empty
// strings, cutting digit runs into threes from the right.
const SUPERBPE: RegexList = &[r##"\p{N}+"##, r##"(?=([0-9]{3})+(?![0-9]))"##];

const MINICPM5: RegexList = &[
    r##"\p{N}{1,3}"##,
    r##"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// What llama.cpp sets for one `tokenizer.ggml.pre` value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreDef {
    pub regexes: RegexList,
    /// A word that is itself a token is emitted whole, without merging.
    pub ignore_merges: bool,
    /// Detokenizing removes spaces before punctuation and in contractions.
    pub clean_spaces: bool,
    /// BOS is added by default (before `tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    /// The default BOS id is cleared (ChatGLM).
    pub no_default_bos: bool,
}

const fn def(regexes: RegexList) -> PreDef {
    PreDef {
        regexes,
        ignore_merges: false,
        clean_spaces: true,
        add_bos: false,
        no_default_bos: false,
    }
}
const fn unclean(regexes: RegexList) -> PreDef {
    PreDef {
        clean_spaces: false,
        ..def(regexes)
    }
}

/// Supported names, grouped as llama.cpp groups them.
const PRE_NAMES: &[(&[&str], PreDef)] = &[
    (&["default"], def(DEFAULT)),
    (
        &["minicpm5"],
        PreDef {
            ignore_merges: true,
            ..def(MINICPM5)
        },
    ),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        PreDef {
            ignore_merges: true,
            add_bos: true,
            ..def(LLAMA3)
        },
    ),
    (&["deepseek-llm"], unclean(DEEPSEEK_LLM)),
    (&["deepseek-coder"], unclean(DEEPSEEK_CODER)),
    (
        &["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"],
        unclean(DEEPSEEK3),
    ),
    (&["spark2_5"], unclean(SPARK2_5)),
    (
        &["youtu"],
        PreDef {
            ignore_merges: true,
            ..unclean(YOUTU)
        },
    ),
    (&["falcon"], def(FALCON)),
    (&["mpt", "olmo", "jais", "exaone4"], def(GPT2)),
    (
        &[
            "starcoder",
            "refact",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        def(STARCODER),
    ),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
        ],
        def(GPT2),
    ),
    (&["trillion", "granite-docling"], unclean(GPT2)),
    (&["jais-2"], def(JAIS2)),
    (&["command-r", "smollm"], unclean(STARCODER)),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ],
        unclean(QWEN2),
    ),
    (&["stablelm2", "megrez"], def(QWEN2)),
    (&["qwen35"], unclean(QWEN35)),
    (&["dbrx", "smaug-bpe"], def(LLAMA3)),
    (&["poro-chat"], unclean(PORO)),
    (&["bloom", "gpt3-finnish"], def(PORO)),
    (
        &["chatglm-bpe"],
        PreDef {
            no_default_bos: true,
            ..def(CHATGLM4)
        },
    ),
    (
        &["glm4", "glm5"],
        PreDef {
            no_default_bos: true,
            ignore_merges: true,
            ..def(CHATGLM4)
        },
    ),
    (&["viking"], unclean(VIKING)),
    (
        &["tekken"],
        PreDef {
            ignore_merges: true,
            add_bos: true,
            ..unclean(TEKKEN)
        },
    ),
    (&["exaone-moe"], def(EXAONE_MOE)),
    (
        &["chameleon"],
        PreDef {
            add_bos: true,
            ..unclean(CHAMELEON)
        },
    ),
    (
        &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        unclean(GPT4O),
    ),
    (
        &["granite-embed-multi-97m"],
        PreDef {
            ignore_merges: true,
            ..unclean(GRANITE_EMB_MULTI)
        },
    ),
    (
        &["bailingmoe", "bailingmoe2", "llada-moe"],
        unclean(BAILINGMOE),
    ),
    (&["seed-coder"], unclean(SEED_CODER)),
    (&["ufakzeka"], unclean(UFAKZEKA)),
    (&["laguna"], unclean(LAGUNA)),
    (&["afmoe"], unclean(AFMOE)),
    (&["tiny_aya", "cohere2moe"], unclean(TINY_AYA)),
    (&["kimi-k2"], unclean(KIMI_K2)),
    (&["superbpe"], unclean(SUPERBPE)),
];

/// The definition for `name`; an absent or empty name means llama.cpp's default.
pub(crate) fn lookup(name: Option<&str>) -> Option<PreDef> {
    let name = match name {
        None | Some("") => "default",
        Some(n) => n,
    };
    PRE_NAMES
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, d)| *d)
}

/// Every supported name, for error messages.
pub(crate) fn supported_names() -> String {
    let mut all: Vec<&str> = PRE_NAMES
        .iter()
        .flat_map(|(names, _)| names.iter().copied())
        .collect();
    all.sort_unstable();
    all.join(", ")
}

/// Every distinct regex list, so a test can compile them all.
#[cfg(test)]
pub(crate) fn all_defs() -> impl Iterator<Item = PreDef> {
    PRE_NAMES.iter().map(|(_, d)| *d)
}
