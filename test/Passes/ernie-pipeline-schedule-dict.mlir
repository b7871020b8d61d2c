// The module's `ernie.pipeline` dictionary is read by one checked reader
// (PipelineInfo.h): a missing or ill-typed key is an error at the module
// naming it, in --ernie-pipeline-schedule as in ernie-translate.
// RUN: ernie-opt %s --split-input-file --verify-diagnostics --ernie-pipeline-schedule=micro-batches=2
// RUN: not ernie-opt %S/../Tools/Inputs/repro/opt_pipeline_schedule_min.mlir --ernie-pipeline-schedule=micro-batches=2 2>&1 | FileCheck %s --check-prefix=MIN
// RUN: not ernie-opt %S/../Tools/Inputs/repro/opt_pipeline_schedule_badtype.mlir --ernie-pipeline-schedule=micro-batches=2 2>&1 | FileCheck %s --check-prefix=BADTYPE
// RUN: not ernie-translate --ernie-to-program %S/../Tools/Inputs/repro/opt_pipeline_schedule_min.mlir -o %t 2>&1 | FileCheck %s --check-prefix=MIN
// MIN: opt_pipeline_schedule_min.mlir:1:1: error: 'ernie.pipeline' key 'virtual_stages' is missing
// BADTYPE: opt_pipeline_schedule_badtype.mlir:1:1: error: 'ernie.pipeline' key 'stages' must be an i64 integer

// expected-error @+1 {{'ernie.pipeline' key 'virtual_stages' is missing}}
module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' key 'stages' must be an i64 integer}}
module attributes {ernie.pipeline = {axis = "pp", stages = "x", virtual_stages = 1 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' key 'stages' must be in [1, 1048576], got 0}}
module attributes {ernie.pipeline = {axis = "pp", stages = 0 : i64, virtual_stages = 1 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' key 'axis' must be a non-empty string}}
module attributes {ernie.pipeline = {axis = 3 : i64, stages = 2 : i64, virtual_stages = 1 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' key 'axis' is missing}}
module attributes {ernie.pipeline = {stages = 2 : i64, virtual_stages = 1 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' key 'stage' is unknown}}
module attributes {ernie.pipeline = {axis = "pp", stage = 2 : i64, stages = 2 : i64, virtual_stages = 1 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' key 'schedule' is missing (a scheduled pipeline has both micro_batches and schedule)}}
module attributes {ernie.pipeline = {axis = "pp", micro_batches = 2 : i64, stages = 2 : i64, virtual_stages = 1 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' has too many steps: stages x virtual_stages x micro_batches must be at most 4194304}}
module attributes {ernie.pipeline = {axis = "pp", stages = 4096 : i64, virtual_stages = 1048576 : i64}} {
}

// -----

// expected-error @+1 {{'ernie.pipeline' must be a dictionary}}
module attributes {ernie.pipeline = [2, 1]} {
}

// -----

// expected-error @+1 {{'ernie.pipeline_schedule' must be an array of strings, one per pipeline rank}}
module attributes {ernie.pipeline = {axis = "pp", stages = 1 : i64, virtual_stages = 1 : i64}, ernie.pipeline_schedule = ["F0:0 B0:0", 7]} {
}

// -----

// Found by ernie-fuzz-mlir: 2^20 stages (on a mesh of 2^20) took hours in
// the schedule check, which is quadratic in the stages.
// expected-error @+1 {{'ernie.pipeline' key 'stages' must be at most 4096, got 1048576}}
module attributes {ernie.pipeline = {axis = "pp", stages = 1048576 : i64, virtual_stages = 1 : i64}} {
  ernie.mesh @mesh(pp = 1048576)
}

// -----

// The stages are the coordinates of the mesh's pipeline axis.
// expected-error @+1 {{'ernie.pipeline' has 4 stages, but the module's mesh has no axis 'pp' of that size}}
module attributes {ernie.pipeline = {axis = "pp", stages = 4 : i64, virtual_stages = 1 : i64}} {
  ernie.mesh @mesh(pp = 2)
}

// -----

// expected-error @+1 {{'ernie.pipeline' has 2 stages, but the module's mesh has no axis 'pp' of that size}}
module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
}
