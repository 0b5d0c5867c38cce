// Package providerv1 holds the generated protobuf and gRPC code for the
// chaingate.provider.v1 plugin wire protocol defined in provider.proto.
//
// Regenerate with `go generate ./plugins/...`, which needs on PATH:
//   - protoc 3.21.12 (apt-get install protobuf-compiler)
//   - protoc-gen-go v1.36.12, matching google.golang.org/protobuf in go.mod
//     (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12)
//   - protoc-gen-go-grpc v1.6.2
//     (go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2)
package providerv1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative provider.proto
