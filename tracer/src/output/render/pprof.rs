//! The messages of pprof's `profile.proto` that the tracer writes, for prost to encode.
//! Field numbers are those of the format (github.com/google/pprof, proto/profile.proto);
//! mappings, and the fields the tracer never sets, are left out.

/// A profile: its samples, the locations and functions they refer to by id, and the
/// strings every other message refers to by index (the first is empty).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// What a value measures and in what unit, as string table indices.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(super) struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack (location ids, leaf first), its values (one per sample type) and labels.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A sample's label: a key with a string (`str`) or a number (`num`) value.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(super) struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

/// A place in the code: here, one named frame, through the function of its one line.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(super) struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

/// A function by name (and system name), as string table indices.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(super) struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}
