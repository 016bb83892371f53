#!/usr/bin/env python3
"""Reads ThreadSanitizer logs (TSAN_OPTIONS=log_path=...) and fails on every report in our code.

Debian builds gRPC, protobuf and abseil without TSan. Their lock-based hand-offs are made visible
by absl_sync_annotations.cc, but gRPC also passes work between its threads through its own atomics
(reference counts, lock-free queues), which TSan cannot see, so gRPC still reports races with
itself. TSan's suppressions cannot set those apart: a `race:` entry matches any frame of any stack
in a report, the stack that created the thread included, and every gRPC handler of ours runs on a
thread that gRPC created.

So a data race is dropped only when no racing access was made by our code: in each access's stack
the first frame that is not the C++ standard library, abseil, protobuf, generated code (zerod::v1,
etcd's etcdserverpb/mvccpb/authpb)
or a TSan interceptor is gRPC's or OpenSSL's, or there is no code of ours on the stack at all (a library
working on a library's thread: any instrumented caller of ours would be on the stack). Every other
report, and every other kind of report (lock-order inversion, use after free, ...), is kept.
Reports named in suppressions.txt never reach the logs.

  filter.py LOG_DIR   prints what it kept and counts what it dropped; exits 1 if it kept any.
"""
import glob
import os
import re
import sys

# Code that runs on behalf of whoever calls it: the caller owns the access.
PASSIVE = re.compile(r'^(std::|__gnu_cxx::|__cxxabiv1::|google::protobuf::|zerod::v1::'
                     r'|etcdserverpb::|mvccpb::|authpb::'
                     r'|absl::|operator new|operator delete|__tsan|__interceptor|__sanitizer)')
GRPC = re.compile(r'^(grpc::|grpc_|grpc_core::|grpc_event_engine::|grpc_impl::|gpr_|tsi_|upb_)')
GRPC_MODULE = re.compile(r'^lib(grpc|gpr|address_sorting|upb)')
# OpenSSL (gRPC's TLS), not built with TSan: its frames are a library's, never ours.
LIBRARY_MODULE = re.compile(r'^lib(ssl|crypto)\.')
PASSIVE_MODULE = re.compile(r'^lib(stdc\+\+|protobuf|absl_|c\.so|m\.so)')
ANNOTATIONS = 'tests/tsan/absl_sync_annotations.cc'  # calls abseil on behalf of its caller
# Frames inlined from a library's headers, by source file: with line tables only (the sanitizer
# trees' -gline-tables-only) an inlined frame's name is unqualified (`operator=`, `_M_length`), so
# its header tells whose code it is (generated protobuf code, *.pb.cc/h, as by its zerod::v1 name).
GRPC_SOURCE = re.compile(r'^/usr/include/(grpcpp|grpc|grpc\+\+)/')
PASSIVE_SOURCE = re.compile(r'(/include/c\+\+/|^/usr/include/(absl|google/protobuf)/|\.pb\.(cc|h)$)')
ACCESS = re.compile(r'^  (Previous )?(atomic )?(read|write|Read|Write) of size')


def function_name(symbol):
    """`void ns::f<T>(args) const` -> `ns::f`."""
    symbol = symbol.replace('(anonymous namespace)', '{anonymous}')
    depth, out = 0, []
    for ch in symbol:
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    name = ''.join(out).split('(')[0].strip()
    return name.split(' ')[-1] if name else symbol


def frames(lines):
    """(function, module, source file or '') for each frame of a stack."""
    result = []
    for line in lines:
        m = re.match(r'\s+#\d+ (.*?) (\S+)( \(\S+\))?( \(BuildId: \w+\))?$', line)
        if not m:
            continue
        symbol, where, module = m.group(1), m.group(2), m.group(3) or ''
        if where.startswith('('):  # no source line: `fn <null> (module+0x...)` style
            module = where
        module = os.path.basename(module.strip(' ()').split('+')[0])
        result.append((function_name(symbol), module, where.split(':')[0] if where.startswith('/') else ''))
    return result


def owner(stack):
    for fn, module, source in stack:
        if GRPC.match(fn) or GRPC_MODULE.match(module) or GRPC_SOURCE.match(source):
            return 'grpc'
        if PASSIVE_SOURCE.search(source):
            continue
        if LIBRARY_MODULE.match(module):
            return 'library'
        if PASSIVE.match(fn) or PASSIVE_MODULE.match(module) or source.endswith(ANNOTATIONS):
            continue
        if not source and not module.startswith('lib'):
            continue  # a TSan interceptor (memcpy, malloc, sendmsg, ...) linked into our binary
        return 'ours'
    # No code of ours and no gRPC frame: library code (abseil's Status, ...) called from a library
    # thread, since any instrumented caller of ours would be on the stack.
    return 'library' if stack else 'ours'


def sections(report):
    current = None
    for line in report.splitlines():
        if re.match(r'  \S', line) and not line.lstrip().startswith('#'):
            current = [line]
            yield current
        elif current is not None:
            current.append(line)


def not_ours(report):
    if not re.search(r'WARNING: ThreadSanitizer: data race( on vptr)? ', report):
        return False
    accesses = [s for s in sections(report) if ACCESS.match(s[0])]
    owners = [owner(frames(a[1:])) for a in accesses]
    return bool(owners) and 'ours' not in owners


def main():
    log_dir = sys.argv[1]
    kept, dropped = [], 0
    for path in sorted(glob.glob(os.path.join(log_dir, '*'))):
        text = open(path, errors='replace').read()
        for report in re.split(r'^={18}\n', text, flags=re.M):
            if 'WARNING: ThreadSanitizer' not in report:
                continue
            if not_ours(report):
                dropped += 1
            else:
                kept.append((path, report))
    for path, report in kept:
        print(f'==== {path}\n{report}')
    print(f'tsan: {len(kept)} report(s) in our code, {dropped} inside gRPC or a library dropped ({log_dir})')
    return 1 if kept else 0


if __name__ == '__main__':
    sys.exit(main())
