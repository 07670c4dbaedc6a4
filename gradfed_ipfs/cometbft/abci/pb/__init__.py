"""Generated protobuf code (do not edit): run scripts/gen-abci-proto.

CometBFT v1.0.1's proto/cometbft/abci/v1/types.proto and what it imports, and
gogoproto v1.7.0's gogo.proto, compiled by grpcio-tools.
"""
