"""The environment server's service-level checks of `rlfleet env check` (rlfleet/app/env_check.py): its
health Watch, its contract revision and Describe, the bearer token refused, NOT_SERVING on SIGTERM.
Mixed into EnvContractChecker, whose channel, stub and settings they use.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.env.contract import CONTRACT_REVISION, DECIDED, since
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc.call_release import release_call
from rlfleet.rpc.channel import open_channel
from rlfleet.app.conformance import NA, Failed, NotApplicable


class ServiceChecks:
    """Mixed into EnvContractChecker: the checks of the server as a service, not of its episodes."""

    def check_health_watch(self) -> str:
        stream = health_pb2_grpc.HealthStub(self.channel).Watch(health_pb2.HealthCheckRequest(),
                                                                timeout=self.timeout_s)
        try:
            first = next(stream)
        except grpc.RpcError as err:
            code, why = err.code(), f"{err.code().name}: {err.details()}"
            release_call(err)  # a failed stream must not wait for the final collection
            if code == grpc.StatusCode.UNIMPLEMENTED:  # revision 1 asked for Check only
                self.warn(f"grpc.health.v1 Watch is not implemented ({since(DECIDED)} asks for Check and "
                          "Watch): rlfleet falls back to Check")
                return "UNIMPLEMENTED"
            raise Failed(f"grpc.health.v1 Watch failed: {why}") from None
        except StopIteration:
            raise Failed("grpc.health.v1 Watch ended without a status") from None
        finally:
            stream.cancel()
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(first.status)
        if status != "SERVING":
            raise Failed(f"Watch says {status}")
        return "Watch says SERVING"

    def check_token_refused(self) -> str:
        if self.security is None or not self.security.token:
            return NA
        outcomes = []
        for label, token in (("no token", None), ("another token", "not-" + self.security.token)):
            channel = open_channel(self.address, dataclasses.replace(self.security, token=token))
            try:
                environment_pb2_grpc.EnvironmentStub(channel).Start(pb.StartRequest(), timeout=self.timeout_s)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAUTHENTICATED:
                    raise Failed(f"a call with {label} ended {err.code().name}, not "
                                 "UNAUTHENTICATED") from None
                outcomes.append(label)
            else:
                raise Failed(f"a call with {label} was answered")
            finally:
                channel.close()
        return f"UNAUTHENTICATED with {' and with '.join(outcomes)}"

    def check_shutdown(self) -> str:
        """Last: SIGTERM to the server; its health must say NOT_SERVING before it goes."""
        if self.stop_pid is None:
            return NA
        stream = health_pb2_grpc.HealthStub(self.channel).Watch(health_pb2.HealthCheckRequest(),
                                                                timeout=self.timeout_s + 30)
        seen = []
        try:
            seen.append(next(stream).status)
            os.kill(self.stop_pid, signal.SIGTERM)
            for reply in stream:
                seen.append(reply.status)
                if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    return "NOT_SERVING after SIGTERM"
        except grpc.RpcError as err:
            said = [health_pb2.HealthCheckResponse.ServingStatus.Name(s) for s in seen]
            code = err.code().name
            release_call(err)
            raise Failed(f"after SIGTERM the server went ({code}) without saying NOT_SERVING "
                         f"(Watch said {said})") from None
        except ProcessLookupError:
            raise Failed(f"no process {self.stop_pid} to send SIGTERM") from None
        finally:
            stream.cancel()
        raise Failed("after SIGTERM the Watch stream ended without NOT_SERVING")

    def check_revision(self) -> str:
        """The contract revision the server reports in Describe (DescribeResponse.contract_revision)."""
        reply = self.optional("Describe",
                              lambda: self.stub.Describe(pb.DescribeRequest(), timeout=self.timeout_s))
        if reply is NA:
            return NotApplicable(f"not reported (no Describe); checked against revision {CONTRACT_REVISION}")
        theirs = reply.contract_revision
        if theirs == CONTRACT_REVISION:
            return f"{theirs}, this checker's"
        if theirs == 0:
            self.warn(f"not reported (Describe's contract_revision is 0: written before revision 3); "
                      f"checked against revision {CONTRACT_REVISION}")
        elif theirs < CONTRACT_REVISION:
            self.warn(f"written against revision {theirs}; checked against revision {CONTRACT_REVISION} "
                      "(what changed since: docs/environments.md, Contract revisions)")
        else:
            self.warn(f"revision {theirs} is newer than this checker's {CONTRACT_REVISION}: update rlfleet")
        return str(theirs)

    def check_describe(self) -> str:
        reply = self.optional("Describe",
                              lambda: self.stub.Describe(pb.DescribeRequest(), timeout=self.timeout_s))
        if reply is NA:
            return NA
        for tool in reply.tools:
            if tool.parameters_json:
                try:
                    json.loads(tool.parameters_json)
                except json.JSONDecodeError:
                    raise Failed(f"tool {tool.name!r}: parameters_json is not JSON") from None
        return f"name={reply.name or '-'} tools={[t.name for t in reply.tools]}"
