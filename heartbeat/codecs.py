"""The `hbw` and `hbd` header codecs, re-exported from `div.heartbeat_headers` where they live.

They moved to `div` so that DIV restore (which reads `hbd`) keeps the dependency direction heartbeat → div;
every name this module had still works from here.
"""

from div.heartbeat_headers import (
    HBD_HEADER,
    HBD_MAGIC,
    HBW_HEADER,
    HBW_MAGIC,
    VERSION,
    DivState,
    HeaderError,
    Watermarks,
    _hbd_schema,
    _hbw_schema,
    decode_hbd,
    decode_hbw,
    div_state_datum,
    encode_hbd,
    encode_hbw,
    guid_to_key,
    producer_state_schema,
)

__all__ = [
    "HBD_HEADER", "HBD_MAGIC", "HBW_HEADER", "HBW_MAGIC", "VERSION", "DivState", "HeaderError", "Watermarks",
    "_hbd_schema", "_hbw_schema", "decode_hbd", "decode_hbw", "div_state_datum", "encode_hbd", "encode_hbw",
    "guid_to_key", "producer_state_schema",
]
