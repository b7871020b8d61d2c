// Placeholder: being written (see PipelineSchedule.h).
#include "ernie/runtime/PipelineSchedule.h"
