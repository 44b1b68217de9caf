"""The messages of gRPC's health checking protocol (``grpc.health.v1``), which Triton serves beside
its own service and Kubernetes' gRPC probes and load balancers call.

They are built from their descriptor by protobuf itself, in a pool of their own: the package
that ships them compiled (grpcio-health-checking) requires protobuf 7 in the versions that match
tritium's grpcio, and tritium pins protobuf below 7.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE_NAME = "grpc.health.v1.Health"
_FIELD = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="tritium/grpc/health/v1/health.proto", package="grpc.health.v1",
                                              syntax="proto3")
    request = file.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=_FIELD.TYPE_STRING, label=_FIELD.LABEL_OPTIONAL)
    response = file.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for name, number in (("UNKNOWN", 0), ("SERVING", 1), ("NOT_SERVING", 2), ("SERVICE_UNKNOWN", 3)):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=_FIELD.TYPE_ENUM, label=_FIELD.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    service = file.service.add(name="Health")
    service.method.add(name="Check", input_type=".grpc.health.v1.HealthCheckRequest",
                       output_type=".grpc.health.v1.HealthCheckResponse")
    service.method.add(name="Watch", input_type=".grpc.health.v1.HealthCheckRequest",
                       output_type=".grpc.health.v1.HealthCheckResponse", server_streaming=True)
    return file


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())
HealthCheckRequest = message_factory.GetMessageClass(_pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest"))
HealthCheckResponse = message_factory.GetMessageClass(_pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse"))
