"""Sans-I/O binlog codec: headers, checksums, lazy event views, GTIDs, file framing."""
